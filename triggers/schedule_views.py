"""The console's schedule pages: an instance's schedules (make one, the next five firings previewed before
saving), edit, pause, run now, delete, and each schedule's firing history. Another user's instance or
schedule is a 404.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods, require_POST

from instances.models import Instance
from triggers import scheduling
from triggers.forms import ScheduleForm
from triggers.models import Schedule
from triggers.services import TriggerRefused, of_instance
from triggers.views import deleted, owned, paused
from web.console.views import _nav, see_other, show_refusal

FIRINGS_SHOWN = 20


def _see_other(instance_id: int) -> HttpResponse:
    return see_other("triggers:schedules", instance_id)


def _own_schedule(request: HttpRequest, schedule_id: int) -> Schedule:
    return owned(request, Schedule, schedule_id)


def _previewed(form: ScheduleForm) -> list[Any] | None:
    """The next firings of the form's timing, or None with the refusal on the form."""
    try:
        return scheduling.preview(form.values())
    except TriggerRefused as exc:
        show_refusal(form, exc)
        return None


def _submitted(
    request: HttpRequest, form: ScheduleForm, save: Callable[[], HttpResponse]
) -> tuple[list[Any] | None, int, HttpResponse | None]:
    """A schedule form's POST: its timing previewed, then saved by `save` unless only a preview was asked.

    Return the preview, the page's status and, once saved, where to go (`save`'s answer).
    """
    if request.method != "POST" or not form.is_valid():
        return None, 400 if request.method == "POST" else 200, None
    preview = _previewed(form)
    if preview is None:
        return None, 400, None
    if request.POST.get("action") == "preview":
        return preview, 200, None
    try:
        return preview, 400, save()
    except TriggerRefused as exc:
        show_refusal(form, exc)
        return preview, 400, None


@login_required
@require_http_methods(["GET", "POST"])
def schedule_list(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = get_object_or_404(Instance, owner=request.user, pk=instance_id)
    form = ScheduleForm(request.POST or None)

    def save() -> HttpResponse:
        schedule = scheduling.schedule_create(
            user=request.user, instance=instance, via="console", request=request, **form.values()
        )
        messages.success(request, f"Schedule “{schedule.name}” made: it fires {schedule.when()}.")
        return _see_other(instance.pk)

    preview, status, done = _submitted(request, form, save)
    if done is not None:
        return done
    schedules = [
        {
            "schedule": s,
            "next": scheduling.next_firings(s),
            "firings": list(s.firings.select_related("run")[:FIRINGS_SHOWN]),
        }
        for s in of_instance(Schedule, request.user, instance)
    ]
    context = {
        "instance": instance,
        "form": form,
        "preview": preview,
        "schedules": schedules,
        **_nav(request),
    }
    return render(request, "triggers/schedule_list.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def schedule_edit(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = _own_schedule(request, schedule_id)
    form = ScheduleForm(request.POST) if request.method == "POST" else ScheduleForm.of(schedule)

    def save() -> HttpResponse:
        scheduling.schedule_change(
            user=request.user, schedule=schedule, changes=form.values(), via="console", request=request
        )
        messages.success(request, f"Schedule “{schedule.name}” saved.")
        return _see_other(schedule.instance_id)

    preview, status, done = _submitted(request, form, save)
    if done is not None:
        return done
    context = {
        "schedule": schedule,
        "instance": schedule.instance,
        "form": form,
        "preview": preview,
        **_nav(request),
    }
    return render(request, "triggers/schedule_edit.html", context, status=status)


@login_required
@require_POST
def schedule_pause(request: HttpRequest, schedule_id: int) -> HttpResponse:
    return paused(request, scheduling.schedule_change, _own_schedule(request, schedule_id), "triggers:schedules")


@login_required
@require_POST
def schedule_run(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = _own_schedule(request, schedule_id)
    firing = scheduling.run_now(user=request.user, schedule=schedule, via="console", request=request)
    if firing.run_id:
        messages.success(request, f"Schedule “{schedule.name}” fired: run {firing.run_id} started.")
    else:
        messages.warning(request, f"Schedule “{schedule.name}” fired but started no run: {firing.reason}")
    return _see_other(schedule.instance_id)


@login_required
@require_POST
def schedule_delete(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = _own_schedule(request, schedule_id)
    return deleted(request, scheduling.schedule_delete, schedule, "triggers:schedules", "; the runs it started stay.")
