"""The console's page of an instance's triggers: make one (its secret shown once), pause, rotate, delete,
and each trigger's latest deliveries. Another user's instance or trigger is a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from instances.models import Instance
from triggers import services
from triggers.api import hook_url
from triggers.forms import TriggerForm
from triggers.models import Trigger
from web.console.views import _nav

# The session key that carries a new secret from the POST that made it to the one page that shows it.
NEW_SECRET = "tether_new_trigger_secret"
DELIVERIES_SHOWN = 20


def _see_other(instance: Instance) -> HttpResponse:
    response = redirect("triggers:list", instance.pk)
    response.status_code = 303
    return response


def _own_trigger(request: HttpRequest, trigger_id: int) -> Trigger:
    found = Trigger.objects.select_related("instance").filter(owner=request.user, pk=trigger_id).first()
    if found is None:
        raise Http404("no such trigger")
    return found


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
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            request.session[NEW_SECRET] = {"trigger": trigger.pk, "secret": secret}
            return _see_other(instance)
    created = request.session.pop(NEW_SECRET, None) if request.method == "GET" else None
    triggers = list(Trigger.objects.filter(instance=instance, owner=request.user))
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
    request.session[NEW_SECRET] = {"trigger": trigger.pk, "secret": secret}
    return _see_other(trigger.instance)


@login_required
@require_POST
def trigger_pause(request: HttpRequest, trigger_id: int) -> HttpResponse:
    trigger = _own_trigger(request, trigger_id)
    active = request.POST.get("active") == "1"
    services.trigger_change(
        user=request.user, trigger=trigger, changes={"active": active}, via="console", request=request
    )
    messages.success(request, f"Trigger “{trigger.name}” {'resumed' if active else 'paused'}.")
    return _see_other(trigger.instance)


@login_required
@require_POST
def trigger_delete(request: HttpRequest, trigger_id: int) -> HttpResponse:
    trigger = _own_trigger(request, trigger_id)
    instance = trigger.instance
    services.trigger_delete(user=request.user, trigger=trigger, via="console", request=request)
    messages.success(request, f"Deleted trigger “{trigger.name}”: its URL answers 404 from now on.")
    return _see_other(instance)
