"""The console's pages for configuring agents: instances from templates, credentials, budgets.

Every change goes through `instances.services` (validation, capabilities, template, price),
so a refusal reads the same here as on the API: a capability refusal answers 403 and saves
nothing. A user without the run_programs capability sees the fields they may set and a
read-only summary of what the template fixes; a user with it gets the full form. Another
user's instance or credential is a 404 on every view.
"""

from __future__ import annotations

import shlex
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from audit import trail
from budgets import money
from budgets import selectors as budget_selectors
from budgets.models import Pool, Price
from instances import capabilities, protected, services, templates_loader
from instances.models import AgentTemplate, Credential, Instance
from web.console.instance_forms import FIXED_LABELS, CredentialForm, InstanceForm
from web.console.views import _instance, _nav


def _values_of(source: AgentTemplate | Instance) -> dict[str, Any]:
    """Return the instance field values `source` gives (a template's defaults, or an instance's own)."""
    if isinstance(source, AgentTemplate):
        return {**{f: getattr(Instance(), f) for f in services.COPIED}, **source.instance_defaults()}
    return {**services.copy_values(source), "workspace": source.workspace, "name": source.name}


def _fixed(values: dict[str, Any], form: InstanceForm) -> list[tuple[str, Any, str]]:
    """Return (label, value, kind) for what the person cannot change in `form`: the read-only summary."""
    rows = []
    for name, label in FIXED_LABELS.items():
        if name in form.fields or (name == "command" and values.get("brain") != Instance.Brain.COMMAND):
            continue
        if values.get("brain") == Instance.Brain.COMMAND and name in InstanceForm.CLAUDE_ONLY:
            continue  # a program uses none of it
        value = values.get(name)
        if name == "brain":
            value = "Claude (anthropic)" if value == Instance.Brain.ANTHROPIC else "a program (command)"
        if name in ("tool_timeout_seconds", "act_timeout_seconds"):
            value = f"{value} s"
        if name == "network":
            value = "reaches the network" if value else "no network"
        if name == "protect_defaults":
            value = "yes, with the paths above" if value else "no: only the paths above"
        if name == "base_url" and not value:
            value = "the server's"
        if name == "command":  # as a shell takes it, quotes and all
            value = shlex.join(value or [])
        if name == "checks":
            value = [{**check, "line": shlex.join(check.get("command") or [])} for check in value or []]
        kind = {"system_prompt": "text", "checks": "checks", "command": "argv"}.get(name, "list" if isinstance(value, list) else "")
        rows.append((label, value, kind))
    return rows


def _form_page(
    request: HttpRequest,
    form: InstanceForm,
    *,
    title: str,
    action: str,
    values: dict[str, Any],
    template: AgentTemplate | None,
    instance: Instance | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    if not form.full and template is not None and "objective_max_chars" in form.fields:
        cap = form.fields["objective_max_chars"]  # the template's bounds it (capabilities.check_instance)
        cap.help_text = f"at most {template.objective_max_chars:,}, the template's"
        cap.widget.attrs["max"] = str(template.objective_max_chars)
    context = {
        "title": title,
        "form": form,
        "action": action,
        "template": template,
        "instance": instance,
        "error": error,
        "chosen": [form[name] for name in InstanceForm.SAFE if name in form.fields],
        "operator": [form[name] for name in form.fields if name not in InstanceForm.SAFE],
        "fixed": [] if form.full else _fixed(values, form),
        "priced_models": sorted(set(Price.objects.values_list("model", flat=True))),
        "budget": budget_for(instance) if instance is not None else None,
        "protected": protected.globs_for(instance) if instance is not None else [],
        **_nav(request),
    }
    return render(request, "loops/instance_form.html", context, status=status)


def _hand_posted(request: HttpRequest, form: InstanceForm, template: Any) -> None:
    """Refuse (CapabilityError) operator fields posted to a form that did not offer them."""
    extra = {k: request.POST.get(k) for k in InstanceForm.base_fields if k in request.POST and k not in form.fields}
    if extra:
        capabilities.check_instance(request.user, extra, template=template)


def _save(
    request: HttpRequest, form: InstanceForm, template: Any, save: Any, page: dict[str, Any]
) -> HttpResponse | Instance:
    """Validate `form` and call `save(values)`; return the saved instance or the page with why not."""
    try:
        _hand_posted(request, form, template)
    except capabilities.CapabilityError as exc:
        return _form_page(request, form, error=str(exc), status=403, **page)
    if not form.is_valid():
        return _form_page(request, form, status=400, **page)
    try:
        return save(form.values())
    except services.InstanceRefused as exc:
        if exc.field and exc.field in form.fields:
            form.add_error(exc.field, exc.message)
            return _form_page(request, form, status=exc.status, **page)
        return _form_page(request, form, error=exc.message, status=exc.status, **page)


def _instance_form(
    request: HttpRequest, template: Any, values: dict[str, Any], page: dict[str, Any], write: Any, done: Any,
    **purpose: str,
) -> HttpResponse:
    """An instance's form: on a GET the form filled with `values`; on a POST `write(values)` (`_save`), then
    `done(saved)` said as a success on the saved instance's page. `page`: the title, and the instance edited."""
    form = InstanceForm(
        request.POST or None, user=request.user, full=capabilities.may_run_programs(request.user), initial=values,
        **purpose,
    )
    page = {**page, "action": request.path, "values": values, "template": template}
    if request.method == "GET":
        return _form_page(request, form, **page)
    saved = _save(request, form, template, write, page)
    if isinstance(saved, HttpResponse):
        return saved
    messages.success(request, done(saved))
    return redirect("loops:instance-detail", instance_id=saved.pk)


# --- pages ----------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET"])
def instance_new(request: HttpRequest) -> HttpResponse:
    """Choose a template to create an instance from; archived instances can be restored here."""
    start_here, roles = templates_loader.grouped(AgentTemplate.objects.order_by("name"))
    context = {
        "templates": start_here,
        "roles": roles,
        "archived": Instance.objects.filter(owner=request.user, archived_at__isnull=False).order_by("-archived_at"),
        "full": capabilities.may_run_programs(request.user),
        **_nav(request),
    }
    return render(request, "loops/instance_new.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def instance_create(request: HttpRequest, template: str) -> HttpResponse:
    chosen = get_object_or_404(AgentTemplate, name=template)
    values = {**_values_of(chosen), "name": services.free_name(request.user, chosen.name)}
    return _instance_form(
        request, chosen, values, {"title": f"New instance from “{chosen.name}”"},
        lambda v: services.instance_create(user=request.user, values=v, template=chosen, via="console", request=request),
        lambda saved: f"Created “{saved.name}” from the {chosen.name} template.",
    )


@login_required
@require_http_methods(["GET", "POST"])
def instance_edit(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = _instance(request, instance_id)
    return _instance_form(
        request, instance.template, _values_of(instance), {"title": f"Edit “{instance.name}”", "instance": instance},
        lambda v: services.instance_update(instance=instance, user=request.user, values=v, via="console", request=request),
        lambda saved: f"Saved “{saved.name}”. Runs started from now on use these settings.",
        purpose="edit",
    )


@login_required
@require_http_methods(["GET", "POST"])
def instance_duplicate(request: HttpRequest, instance_id: int) -> HttpResponse:
    source = _instance(request, instance_id)
    values = {**_values_of(source), "name": services.free_name(request.user, f"{source.name} copy"), "workspace": ""}
    return _instance_form(
        request, source.template, values, {"title": f"Duplicate “{source.name}”"},
        lambda v: services.instance_duplicate(source=source, user=request.user, values=v, via="console", request=request),
        lambda saved: f"Created “{saved.name}”, a copy of “{source.name}” with its own workspace.",
        purpose="duplicate",
    )


@login_required
@require_POST
def instance_archive(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = _instance(request, instance_id)
    try:
        services.instance_archive(instance=instance, user=request.user, via="console", request=request)
    except services.InstanceRefused as exc:
        messages.error(request, exc.message)
        return redirect("loops:instance-detail", instance_id=instance.pk)
    messages.success(
        request, f"Archived “{instance.name}”: it left the fleet and starts no new runs; its runs stay below."
    )
    return redirect("loops:instance-detail", instance_id=instance.pk)


@login_required
@require_POST
def instance_restore(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = _instance(request, instance_id)
    services.instance_restore(instance=instance, user=request.user, via="console", request=request)
    messages.success(request, f"Restored “{instance.name}” to the fleet.")
    return redirect("loops:instance-detail", instance_id=instance.pk)


def budget_for(instance: Instance) -> dict[str, Any]:
    """Return the pools that pay for `instance`'s runs, root first, as pages show them.

    Before its first run it has no pool of its own yet: the chain shown is its owner's,
    and its own (unlimited) pool is said to come at the first run.
    """
    chain = budget_selectors.headroom_for_instance(instance)
    pending = not chain.pools
    if pending:
        owner_pool = Pool.objects.filter(kind=Pool.Kind.USER, owner_id=instance.owner_id).first()
        if owner_pool is not None:
            chain = budget_selectors.headroom_for_pool(owner_pool)
    visible = set(budget_selectors.pools_visible_to(instance.owner).filter(
        pk__in=[p.id for p in chain.pools]).values_list("pk", flat=True))
    rows = [
        {
            "id": p.id, "linked": p.id in visible, "name": p.name, "kind": p.kind, "period": p.period, "limit": money.format_usd(p.limit),
            "spent": money.format_usd(p.spent), "reserved": money.format_usd(p.reserved),
            "remaining": money.format_usd(p.remaining), "limited": p.limit is not None,
            "limiting": chain.limiting is not None and chain.limiting.id == p.id, "overdrawn": p.overdrawn,
            "over_threshold": p.over_threshold,
        }
        for p in chain.pools
    ]
    return {"pools": rows, "remaining": money.format_usd(chain.remaining), "pending": pending}


@login_required
@require_http_methods(["GET"])
def instance_budget(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = _instance(request, instance_id)
    context = {"instance": instance, "budget": budget_for(instance), **_nav(request)}
    return render(request, "loops/instance_budget.html", context)


@login_required
@require_http_methods(["GET"])
def pool_detail(request: HttpRequest, pool_id: int) -> HttpResponse:
    """One budget pool: its limit, spend and headroom, and who changed it (newest first).

    Only a pool the user may see (`budgets.selectors.pools_visible_to`); another's is a 404.
    """
    pool = budget_selectors.pools_visible_to(request.user).filter(pk=pool_id).first()
    if pool is None:
        raise Http404("no such pool")
    headroom = budget_selectors.pool_headroom(pool)
    context = {
        "pool": pool,
        "row": {
            "limit": money.format_usd(headroom.limit), "spent": money.format_usd(headroom.spent),
            "reserved": money.format_usd(headroom.reserved), "remaining": money.format_usd(headroom.remaining),
            "limited": headroom.limit is not None,
        },
        "entries": trail.for_page(trail.audit_for_pool(pool), request.user),
        "audit_title": "Changes to this pool",
        "audit_csv": f"{reverse('reviews:audit-csv')}?pool={pool.pk}",
        **_nav(request),
    }
    return render(request, "loops/pool_detail.html", context)


# --- credentials ----------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def credentials(request: HttpRequest) -> HttpResponse:
    """List the user's keys (label and last four characters only) and add one."""
    form = CredentialForm(request.POST or None)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                made = services.credential_add(
                    user=request.user, label=form.cleaned_data["label"], secret=form.cleaned_data["secret"],
                    via="console", request=request,
                )
            except services.InstanceRefused as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
                status = exc.status
            else:
                messages.success(request, f"Stored the key “{made.label}” (…{made.last4}), encrypted.")
                return redirect(_next(request) or "loops:credentials")
    context = {
        "form": form,
        "credentials": Credential.objects.filter(owner=request.user).order_by("label"),
        "next": _next(request),
        **_nav(request),
    }
    response = render(request, "loops/credential_list.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def credential_remove(request: HttpRequest, credential_id: int) -> HttpResponse:
    removed = services.credential_remove(user=request.user, credential_id=credential_id, via="console",
                                         request=request)
    if removed is None:
        raise Http404("no such credential")
    label, last4 = removed.label, removed.last4
    messages.success(request, f"Removed the key “{label}” (…{last4}); instances that used it have none now.")
    return redirect("loops:credentials")


def _next(request: HttpRequest) -> str:
    """Return a same-site path to go back to after adding a key (only this console's own pages)."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    safe = url_has_allowed_host_and_scheme(target, allowed_hosts=None) and target.startswith("/")
    return target if safe else ""
