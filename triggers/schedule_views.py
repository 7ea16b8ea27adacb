"""The console's schedule pages: an instance's schedules (make one, the next five firings previewed before
saving), edit, pause, run now, delete, and each schedule's firing history. Another user's instance or
schedule is a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from instances.models import Instance
from triggers import scheduling
from triggers.forms import ScheduleForm
from triggers.models import Schedule
from triggers.services import TriggerRefused
from web.console.views import _nav

FIRINGS_SHOWN = 20


def _see_other(instance_id: int) -> HttpResponse:
    response = redirect("triggers:schedules", instance_id)
    response.status_code = 303
    return response


def _own_schedule(request: HttpRequest, schedule_id: int) -> Schedule:
    found = Schedule.objects.select_related("instance").filter(owner=request.user, pk=schedule_id).first()
    if found is None:
        raise Http404("no such schedule")
    return found


def _previewed(form: ScheduleForm) -> list[Any] | None:
    """The next firings of the form's timing, or None with the refusal on the form."""
    try:
        return scheduling.preview(form.values())
    except TriggerRefused as exc:
        form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        return None


@login_required
@require_http_methods(["GET", "POST"])
def schedule_list(request: HttpRequest, instance_id: int) -> HttpResponse:
    instance = get_object_or_404(Instance, owner=request.user, pk=instance_id)
    form = ScheduleForm(request.POST or None)
    preview = None
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            preview = _previewed(form)
            if preview is not None and request.POST.get("action") == "preview":
                status = 200
            elif preview is not None:
                try:
                    schedule = scheduling.schedule_create(
                        user=request.user, instance=instance, via="console", request=request, **form.values()
                    )
                except TriggerRefused as exc:
                    form.add_error(exc.field if exc.field in form.fields else None, exc.message)
                else:
                    messages.success(request, f"Schedule “{schedule.name}” made: it fires {schedule.when()}.")
                    return _see_other(instance.pk)
    schedules = [
        {
            "schedule": s,
            "next": scheduling.next_firings(s),
            "firings": list(s.firings.select_related("run")[:FIRINGS_SHOWN]),
        }
        for s in Schedule.objects.filter(instance=instance, owner=request.user)
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
    preview = None
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            preview = _previewed(form)
            if preview is not None and request.POST.get("action") == "preview":
                status = 200
            elif preview is not None:
                try:
                    scheduling.schedule_change(
                        user=request.user,
                        schedule=schedule,
                        changes=form.values(),
                        via="console",
                        request=request,
                    )
                except TriggerRefused as exc:
                    form.add_error(exc.field if exc.field in form.fields else None, exc.message)
                else:
                    messages.success(request, f"Schedule “{schedule.name}” saved.")
                    return _see_other(schedule.instance_id)
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
    schedule = _own_schedule(request, schedule_id)
    active = request.POST.get("active") == "1"
    scheduling.schedule_change(
        user=request.user, schedule=schedule, changes={"active": active}, via="console", request=request
    )
    messages.success(request, f"Schedule “{schedule.name}” {'resumed' if active else 'paused'}.")
    return _see_other(schedule.instance_id)


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
    instance_id = schedule.instance_id
    scheduling.schedule_delete(user=request.user, schedule=schedule, via="console", request=request)
    messages.success(request, f"Deleted schedule “{schedule.name}”; the runs it started stay.")
    return _see_other(instance_id)
