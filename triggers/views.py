"""The console's page of an instance's triggers: make one (its secret shown once), pause, rotate, delete,
and each trigger's latest deliveries. Another user's instance or trigger is a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods, require_POST

from instances.models import Instance
from triggers import services
from triggers.api import hook_url
from triggers.forms import TriggerForm
from triggers.models import Schedule, Trigger
from web.console.views import _nav, see_other, show_refusal

# The session key that carries a new secret from the POST that made it to the one page that shows it.
NEW_SECRET = "tether_new_trigger_secret"
DELIVERIES_SHOWN = 20


def _see_other(instance: Instance) -> HttpResponse:
    return see_other("triggers:list", instance.pk)


def _show_once(request: HttpRequest, trigger: Trigger, secret: str) -> None:
    """Keep a new secret for the one page that shows it (`NEW_SECRET`)."""
    request.session[NEW_SECRET] = {"trigger": trigger.pk, "secret": secret}


def owned(request: HttpRequest, model: type[Trigger] | type[Schedule], item_id: int) -> Any:
    """The caller's trigger or schedule `item_id` (`services.owned`); anyone else's is a 404."""
    found = services.owned(model, request.user, item_id)
    if found is None:
        raise Http404(f"no such {model._meta.model_name}")
    return found


def paused(request: HttpRequest, change: Any, item: Trigger | Schedule, back: str) -> HttpResponse:
    """Pause (or resume, when the form says active=1) a trigger or a schedule through its service's change;
    then back to the instance's page named `back`."""
    active = request.POST.get("active") == "1"
    services.set_active(change, request.user, item, active, via="console", request=request)
    messages.success(request, f"{item._meta.model_name.capitalize()} “{item.name}” {'resumed' if active else 'paused'}.")
    return see_other(back, item.instance_id)


def deleted(request: HttpRequest, delete: Any, item: Trigger | Schedule, back: str, after: str) -> HttpResponse:
    """Delete a trigger or a schedule through its service's delete, say so (`after` ends the sentence); then back
    to the instance's page named `back`."""
    services.delete_with(delete, request.user, item, via="console", request=request)
    messages.success(request, f"Deleted {item._meta.model_name} “{item.name}”{after}")
    return see_other(back, item.instance_id)


def _own_trigger(request: HttpRequest, trigger_id: int) -> Trigger:
    return owned(request, Trigger, trigger_id)


@login_required
@require_http_methods(["GET", "POST"])
def trigger_list(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = get_object_or_404(Instance, owner=request.user, pk=instance_id)
    form = TriggerForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            trigger, secret = services.trigger_create(
                user=request.user, instance=instance, via="console", request=request, **form.values()
            )
        except services.TriggerRefused as exc:
            show_refusal(form, exc)
        else:
            _show_once(request, trigger, secret)
            return _see_other(instance)
    created = request.session.pop(NEW_SECRET, None) if request.method == "GET" else None
    triggers = list(services.of_instance(Trigger, request.user, instance))
    shown: list[dict[str, Any]] = [
        {
            "trigger": t,
            "url": hook_url(request, t),
            "secret": created["secret"] if created and created.get("trigger") == t.pk else None,
            "deliveries": list(t.deliveries.all()[:DELIVERIES_SHOWN]),
        }
        for t in triggers
    ]
    context = {"instance": instance, "form": form, "triggers": shown, **_nav(request)}
    response = render(request, "triggers/trigger_list.html", context, status=400 if form.is_bound else 200)
    response["Cache-Control"] = "no-store"  # the response that holds a secret must not be kept
    return response


@login_required
@require_POST
def trigger_rotate(request: HttpRequest, trigger_id: int) -> HttpResponse:
    trigger = _own_trigger(request, trigger_id)
    secret = services.trigger_rotate(user=request.user, trigger=trigger, via="console", request=request)
    _show_once(request, trigger, secret)
    return _see_other(trigger.instance)


@login_required
@require_POST
def trigger_pause(request: HttpRequest, trigger_id: int) -> HttpResponse:
    return paused(request, services.trigger_change, _own_trigger(request, trigger_id), "triggers:list")


@login_required
@require_POST
def trigger_delete(request: HttpRequest, trigger_id: int) -> HttpResponse:
    trigger = _own_trigger(request, trigger_id)
    return deleted(request, services.trigger_delete, trigger, "triggers:list", ": its URL answers 404 from now on.")
