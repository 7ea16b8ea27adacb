"""The console's pages. Reads come from loops.selectors; every change goes through loops.services.

Every view needs a signed-in user, and another user's run or instance is a 404. Forms
post with CSRF and work without JavaScript (post, then redirect back); with htmx the
run page's forms swap just their own block. A double-clicked button or a second device
does not double-send: each form carries a nonce seen at most once, and a start or a
message identical to one made seconds ago by the same person is taken as a repeat.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from audit import trail
from budgets import spending
from instances.models import Instance
from loops import selectors, services
from loops.models import Interjection, Run
from reviews import changecard, rollback
from reviews import selectors as review_selectors
from tether.refusals import Refused
from web.console import live
from web.console.display import EventView, RunView
from web.console.forms import ContinueRunForm, HistoryFilterForm, InterjectForm, ResumeRunForm, StartRunForm

REPEAT_WINDOW = timedelta(seconds=15)
NONCE_SECONDS = 3600
RECENT_RUNS = 20
HISTORY_PAGE = 25


def _instance(request: HttpRequest, instance_id: int) -> Instance:
    instance = selectors.instance_for(request.user, instance_id)
    if instance is None:
        raise Http404("no such instance")
    return instance


def _run(request: HttpRequest, run_id: int) -> Run:
    run = selectors.run_for(request.user, run_id)
    if run is None:
        raise Http404("no such run")
    return run


def _of_run(check: Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]) -> Callable[..., Any]:
    """A console page of one of the caller's runs: signed in, the methods `check` allows, the run looked up
    (`_run`: anyone else's is a 404) and given to the view in place of its id."""

    def wrap(view: Callable[[HttpRequest, Run], HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @check
        @functools.wraps(view)
        def page(request: HttpRequest, run_id: int) -> HttpResponse:
            return view(request, _run(request, run_id))

        return page

    return wrap


def _nonce_key(kind: str, request: HttpRequest, nonce: str) -> str:
    return f"tether:console:{kind}:{request.user.pk}:{nonce}"


# --- fleet ------------------------------------------------------------------------------------


def _nav(request: HttpRequest) -> dict[str, Any]:
    """Return what the navigation shows on every console page: the count of items waiting for review."""
    return {"pending_reviews": review_selectors.pending_count(request.user)}


def show_refusal(form: Any, exc: Refused) -> None:
    """Put a service's refusal on the form: beside its field when the form has that field, else above it."""
    form.add_error(exc.field if exc.field in form.fields else None, exc.message)


def see_other(url_name: str, *args: Any) -> HttpResponse:
    """Redirect with 303 See Other: after a POST, the page is fetched again with a GET."""
    response = redirect(url_name, *args)
    response.status_code = 303
    return response


def console_settings(request: HttpRequest) -> dict[str, Any]:
    """A context processor: what every page's script reads from <body> (see static/console/console.js).

    `TETHER_CONSOLE_TIMEOUT_SECONDS`: how long an action waits for an answer before the page says
    there was none (tether/settings.py refuses a value that is no positive number at start).
    """
    return {"console_timeout_seconds": f"{float(settings.TETHER_CONSOLE_TIMEOUT_SECONDS):g}"}


@login_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    context = {
        **live.fleet_context(request.user),
        **_nav(request),
        "stats": review_selectors.fleet_stats(request.user),
    }
    return render(request, "loops/fleet.html", context)


# --- instance ----------------------------------------------------------------------------------


@login_required
@require_GET
def instance_detail(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = _instance(request, instance_id)
    return _instance_page(request, instance, StartRunForm(instance=instance))


def _instance_page(
    request: HttpRequest, instance: Instance, form: StartRunForm, status: int = 200
) -> HttpResponse:
    runs = [RunView(r) for r in selectors.runs_for(request.user).filter(instance=instance)[:RECENT_RUNS]]
    context = {
        "instance": instance,
        "form": form,
        "runs": runs,
        "env_names": sorted((instance.env or {}).keys()),
        "entries": trail.for_page(trail.audit_for_instance(instance), request.user),
        "audit_title": "Changes to this agent",
        **_nav(request),
    }
    return render(request, "loops/instance_detail.html", context, status=status)


@login_required
@require_POST
def run_start(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = _instance(request, instance_id)
    form = StartRunForm(request.POST, instance=instance)
    if not form.is_valid():
        return _instance_page(request, instance, form, status=400)
    data = form.cleaned_data
    key = _nonce_key("start", request, data["nonce"]) if data["nonce"] else None
    if key and not cache.add(key, 0, NONCE_SECONDS):
        earlier = cache.get(key)
        if earlier:
            return redirect("loops:run-detail", run_id=earlier)
        messages.info(request, "That run is being started already.")
        return redirect("loops:instance-detail", instance_id=instance.pk)
    try:
        with transaction.atomic():
            # Serialise starts on this instance, so a repeat within seconds is seen as one.
            Instance.objects.select_for_update().filter(pk=instance.pk).first()
            repeat = (
                Run.objects.filter(
                    instance=instance,
                    owner=request.user,
                    objective=data["objective"],
                    created_at__gte=timezone.now() - REPEAT_WINDOW,
                )
                .order_by("-id")
                .first()
            )
            run = repeat or services.run_start(
                instance=instance,
                user=request.user,
                objective=data["objective"],
                max_iterations=data["max_iterations"],
                max_cost_usd=data["max_cost_usd"],
                max_minutes=data["max_minutes"],
                via="console",
                request=request,
            )
    except services.Refused as refused:
        if key:
            cache.delete(key)
        form.add_error(None, refused.message)
        return _instance_page(request, instance, form, status=refused.status)
    if key:
        cache.set(key, run.pk, NONCE_SECONDS)
    if repeat is not None:
        messages.info(request, f"Run {run.pk} was started moments ago with this objective; here it is.")
    return redirect("loops:run-detail", run_id=run.pk)


# --- run ------------------------------------------------------------------------------------------


@_of_run(require_GET)
def run_detail(request: HttpRequest, run: Run) -> HttpResponse:
    return _run_page(request, run, InterjectForm(run=run))


def _run_page(
    request: HttpRequest,
    run: Run,
    form: InterjectForm,
    status: int = 200,
    notice: str = "",
    continue_form: ContinueRunForm | None = None,
    resume_form: ResumeRunForm | None = None,
) -> HttpResponse:
    window = selectors.timeline(run)
    context = {
        **live.run_state_context(run, chart_all=request.GET.get("chart") == "all"),
        **({"resume": resume_form.offer} if resume_form is not None else {}),
        "events": [EventView.of(e) for e in window.events],
        "window": window,
        "form": form,
        "continue_form": continue_form or ContinueRunForm(run=run),
        "notice": notice,
        "receipt_url": reverse("api:run-receipt", args=[run.instance_id, run.pk]),
        "entries": trail.audit_for_run(run),
        "rollback": _rollback_card(run),
        "change_card": changecard.for_run(run),
        **_nav(request),
    }
    return render(request, "loops/run_detail.html", context, status=status)


def _rollback_card(run: Run) -> dict[str, Any]:
    """What the run page offers to roll the workspace back to (read only once the run has finished)."""
    if run.status != Run.Status.FINISHED:
        return {"finished": False}
    found = rollback.points(run)
    live = rollback.live_run(run)
    return {"finished": True, "points": found, "offer": rollback.offer(run, found), "live": live}


def _actions(
    request: HttpRequest,
    run: Run,
    form: InterjectForm,
    notice: str = "",
    status: int = 200,
    transient: bool = False,
    resume_form: ResumeRunForm | None = None,
) -> HttpResponse:
    """Answer a run-page form: its block alone for htmx, else the page (or a redirect back to it).

    A `transient` notice ("Sent", "Stopping") hides once the run finishes. A refused resume
    (`resume_form` with its errors) keeps what was typed.
    """
    if request.htmx:
        run.refresh_from_db()
        context = {
            "run": RunView(run), "form": form, "notice": notice, "transient": transient,
            "continue_form": ContinueRunForm(run=run),
            "resume": resume_form.offer if resume_form is not None else live.resume_offer(run),
        }
        return render(request, "loops/run_detail.html#run-actions", context)
    if status >= 400:
        return _run_page(request, run, form, status=status, notice=notice, resume_form=resume_form)
    if notice:
        messages.info(request, notice)
    return redirect("loops:run-detail", run_id=run.pk)


@_of_run(require_POST)
def run_stop(request: HttpRequest, run: Run) -> HttpResponse:
    try:
        run = services.run_cancel(run=run, user=request.user, via="console", request=request)
    except services.Refused:
        run.refresh_from_db()
        notice = f"Run {run.pk} had already finished ({run.outcome.replace('_', ' ')})."
    else:
        notice = (
            "Stopped."
            if run.status == Run.Status.FINISHED
            else "Stopping: the agent is told at once and the run ends within seconds."
        )
        return _actions(request, run, InterjectForm(run=run), notice=notice, transient=True)
    return _actions(request, run, InterjectForm(run=run), notice=notice)


@_of_run(require_POST)
def run_interject(request: HttpRequest, run: Run) -> HttpResponse:
    form = InterjectForm(request.POST, run=run)
    if not form.is_valid():
        return _actions(request, run, form, status=400)
    text, nonce = form.cleaned_data["text"], form.cleaned_data["nonce"]
    waiting = run.status == Run.Status.WAITING
    # Held while this message is tried (a double click waits its turn); spent only if it is accepted.
    key = _nonce_key("interject", request, nonce) if nonce else None
    if key and not cache.add(key, 1, NONCE_SECONDS):
        return _actions(request, run, InterjectForm(run=run), notice="That message was sent already.")
    try:
        with transaction.atomic():
            # The run's row lock serialises messages to it, so a repeat within seconds is seen as one.
            Run.objects.select_for_update().filter(pk=run.pk).first()
            repeat = Interjection.objects.filter(
                run=run, author=request.user, text=text, created_at__gte=timezone.now() - REPEAT_WINDOW
            ).exists()
            if not repeat:
                services.run_interject(run=run, user=request.user, text=text, via="console", request=request)
    except services.Refused as refused:
        if key:  # refused, not sent: the same form may send the corrected message
            cache.delete(key)
        form.add_error(None, refused.message)
        return _actions(request, run, form, status=refused.status)
    if repeat:
        notice = "That message was sent already."
    elif waiting:
        notice = "Answer sent: the run resumes with it."
    else:
        notice = "Sent: the agent reads it at the start of its next iteration."
    return _actions(request, run, InterjectForm(run=run), notice=notice, transient=not repeat)


@_of_run(require_POST)
def run_close(request: HttpRequest, run: Run) -> HttpResponse:
    try:
        run = services.run_close(run=run, user=request.user, via="console", request=request)
    except services.Refused as refused:
        return _actions(request, run, InterjectForm(run=run), notice=refused.message)
    return _actions(request, run, InterjectForm(run=run), notice="Closed without an answer (escalated).")


@_of_run(require_POST)
def run_resume(request: HttpRequest, run: Run) -> HttpResponse:
    """Resume a budget_exhausted run, with a new cap if one is given; one that would end at once is refused."""
    offer = live.resume_offer(run)
    if offer is None:  # not out of budget: the service says why it cannot be resumed
        try:
            run = services.run_resume(run=run, user=request.user, via="console", request=request)
        except services.Refused as refused:
            return _actions(request, run, InterjectForm(run=run), notice=refused.message)
        return _actions(request, run, InterjectForm(run=run), notice="Resumed from its next iteration.")
    form = ResumeRunForm(request.POST, run=run, offer=offer)
    offer.form = form
    if not form.is_valid():
        return _actions(request, run, InterjectForm(run=run), status=400, resume_form=form)
    cap = form.cleaned_data["max_cost_usd"]
    try:
        run = services.run_resume(run=run, user=request.user, via="console", request=request, max_cost_usd=cap)
    except services.Refused as refused:
        form.add_error(None, refused.message)
        return _actions(request, run, InterjectForm(run=run), status=refused.status, resume_form=form)
    notice = "Resumed from its next iteration"
    notice += f" with a cap of {RunView(run).cap}." if cap is not None else "."
    return _actions(request, run, InterjectForm(run=run), notice=notice)


@_of_run(require_POST)
def run_continue(request: HttpRequest, run: Run) -> HttpResponse:
    """Continue a finished run as a new one, then show the new run (a plain form post: works without JavaScript)."""
    form = ContinueRunForm(request.POST, run=run)
    if not form.is_valid():
        return _run_page(request, run, InterjectForm(run=run), status=400, continue_form=form)
    data = form.cleaned_data
    try:
        new = services.run_continue(
            run=run,
            user=request.user,
            max_iterations=data["max_iterations"],
            max_cost_usd=data["max_cost_usd"],
            message=data["message"],
            via="console",
            request=request,
        )
    except services.Refused as refused:
        later = Run.objects.filter(continued_from=run, owner=request.user).first()
        if later is not None:  # a second click, or another device: show the run that continues it
            messages.info(request, f"Run {run.pk} is continued as run {later.pk} already; here it is.")
            return redirect("loops:run-detail", run_id=later.pk)
        run.refresh_from_db()
        return _run_page(
            request, run, InterjectForm(run=run), status=refused.status, notice=refused.message, continue_form=form
        )
    messages.info(request, f"Run {new.pk} continues run {run.pk}.")
    return redirect("loops:run-detail", run_id=new.pk)


@_of_run(require_GET)
def run_timeline(request: HttpRequest, run: Run) -> HttpResponse:
    """Return the events before `?before=SEQ` (an earlier part of the timeline)."""
    try:
        before = int(request.GET.get("before", ""))
        if before < 1:
            raise ValueError
    except ValueError:
        return HttpResponse("before must be a seq of this run (a whole number ≥ 1)", status=400)
    window = selectors.timeline(run, before=before)
    context = {"run": RunView(run), "window": window, "events": [EventView.of(e) for e in window.events]}
    return render(request, "loops/run_detail.html#timeline-earlier", context)


@_of_run(require_GET)
def run_costs(request: HttpRequest, run: Run) -> HttpResponse:
    """Return "Where the money went" for the iterations before `?before=N` (older ones)."""
    try:
        before = int(request.GET.get("before", ""))
        if not 1 <= before <= 2**31:
            raise ValueError
    except ValueError:
        return HttpResponse("before must be an iteration number (a whole number ≥ 1)", status=400)
    found = spending.run_spending(run.pk, before=before)
    context = {
        "run": RunView(run),
        "spending": live.spending_view(found, older=True),
        "costs_url": reverse("api:run-costs", args=[run.instance_id, run.pk]),
    }
    return render(request, "loops/run_detail.html#cost-iterations", context)


# --- history --------------------------------------------------------------------------------------


@login_required
@require_GET
def history(request: HttpRequest) -> HttpResponse:
    owned = list(Instance.objects.filter(owner=request.user).values_list("pk", "name"))
    form = HistoryFilterForm(request.GET or None, instances=owned)
    chosen = selectors.HistoryFilter()
    if form.is_bound and form.is_valid():
        data: dict[str, Any] = form.cleaned_data
        chosen = selectors.HistoryFilter(
            instance=data["instance"], outcome=data["outcome"], origin=data["origin"], since=data["since"],
            until=data["until"],
        )
    runs = selectors.history(request.user, chosen)
    page = Paginator(runs, HISTORY_PAGE).get_page(request.GET.get("page"))
    context = {
        "form": form,
        "page": page,
        "runs": [RunView(r) for r in page.object_list],
        "totals": live.totals_view(selectors.totals(runs)),
        **_nav(request),
    }
    return render(request, "loops/history.html", context)


@login_required
def run_rollback(request: HttpRequest, run_id: int) -> HttpResponse:
    """GET: what rolling the workspace back to `to` would change and leave (the confirmation); POST: do it."""
    run = _run(request, run_id)
    if request.method not in ("GET", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    to = (request.POST if request.method == "POST" else request.GET).get("to", "")
    context: dict[str, Any] = {"run": RunView(run), "to": to, **_nav(request)}
    try:
        if request.method == "GET":
            context["plan"] = rollback.plan(run=run, to=to)
            context["live"] = rollback.live_run(run)
            return render(request, "loops/run_rollback.html", context)
        done = rollback.rollback(run=run, user=request.user, to=to, via="console", request=request)
    except services.Refused as refused:
        context["refused"] = refused.message
        return render(request, "loops/run_rollback.html", context, status=refused.status)
    kept = f" Left as they were (snapshots do not keep them): {', '.join(done.kept[:20])}" if done.kept else ""
    if len(done.kept) > 20:
        kept += f" and {len(done.kept) - 20} more"
    missed = f" Not restored: {'; '.join(done.not_restored[:10])}." if done.not_restored else ""
    messages.info(
        request,
        f"The workspace was rolled back to {done.point.label}: {len(done.added)} added, {len(done.modified)} changed, "
        f"{len(done.deleted)} removed. To undo it, roll back to {done.undo}.{kept}{'.' if kept else ''}{missed}",
    )
    return redirect("loops:run-detail", run_id=run.pk)
