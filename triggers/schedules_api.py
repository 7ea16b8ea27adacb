"""REST: an instance's schedules (a ninja Router added to the trigger API's, under /v1).

Only the instance's owner sees or changes its schedules: anyone else's instance or schedule id
answers 404, as for triggers, instances and runs. Every write goes through `triggers.scheduling`.
A bad cron expression, interval or time zone is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Body, Router, Status

from budgets import money
from loops.schemas import Empty
from triggers import scheduling, schemas
from triggers.models import Firing, Schedule
from triggers.services import TriggerRefused
from web.api import owned_instance
from web.rest import ApiError, Id, errors

router = Router(tags=["schedules"])

SCHEDULES = "/instances/{id:instance_id}/schedules"
SCHEDULE = SCHEDULES + "/{id:schedule_id}"
FIRINGS_SHOWN = 100
NO_BODY = Body(None)


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    return {
        "id": schedule.pk,
        "instance": schedule.instance_id,
        "name": schedule.name,
        "objective_template": schedule.objective_template,
        "cron": schedule.cron or None,
        "interval_minutes": schedule.interval_minutes,
        "timezone": schedule.timezone,
        "starts_at": schedule.starts_at.isoformat() if schedule.starts_at else None,
        "ends_at": schedule.ends_at.isoformat() if schedule.ends_at else None,
        "max_iterations": schedule.max_iterations,
        "max_cost_usd": None
        if schedule.max_cost_micros is None
        else money.usd_string(schedule.max_cost_micros),
        "overlap": schedule.overlap,
        "catch_up_minutes": schedule.catch_up_minutes,
        "active": schedule.active,
        "next_firings": [t.isoformat() for t in scheduling.next_firings(schedule)],
        "created_at": schedule.created_at.isoformat(),
    }


def firing_json(firing: Firing) -> dict[str, Any]:
    return {
        "id": firing.pk,
        "scheduled_for": firing.scheduled_for.isoformat(),
        "fired_at": firing.fired_at.isoformat(),
        "outcome": firing.outcome,
        "reason": firing.reason,
        "manual": firing.manual,
        "run": firing.run_id,
    }


def _schedule(request: HttpRequest, instance_id: int, schedule_id: int) -> Schedule:
    owned_instance(request, instance_id)
    found = Schedule.objects.filter(owner=request.user, instance_id=instance_id, pk=schedule_id).first()
    if found is None:
        raise ApiError(f"schedule {schedule_id} of instance {instance_id} not found", 404)
    return found


def _refused(exc: TriggerRefused) -> ApiError:
    return ApiError(exc.message, exc.status, exc.field)


@router.get(
    SCHEDULES,
    url_name="schedules",
    response={200: schemas.Schedules, **errors()},
    summary="List the instance's schedules",
)
def schedule_list(request: HttpRequest, instance_id: Id) -> Any:
    instance = owned_instance(request, instance_id)
    return {
        "schedules": [
            schedule_json(s) for s in Schedule.objects.filter(instance=instance, owner=request.user)
        ]
    }


@router.post(
    SCHEDULES, url_name="schedules", response={201: schemas.Schedule, **errors()}, summary="Create a schedule"
)
def schedule_create(request: HttpRequest, instance_id: Id, payload: schemas.ScheduleIn) -> Any:
    instance = owned_instance(request, instance_id)
    values = payload.model_dump(exclude_none=True)
    try:
        schedule = scheduling.schedule_create(user=request.user, instance=instance, request=request, **values)
    except TriggerRefused as exc:
        raise _refused(exc) from None
    return Status(201, schedule_json(schedule))


@router.post(
    SCHEDULES + "/preview",
    url_name="schedule-preview",
    response={200: schemas.Preview, **errors()},
    summary="The next 5 firing times of a schedule's timing, before it is saved",
)
def schedule_preview(request: HttpRequest, instance_id: Id, payload: schemas.ScheduleTiming) -> Any:
    owned_instance(request, instance_id)
    try:
        times = scheduling.preview(payload.model_dump(exclude_none=True))
    except TriggerRefused as exc:
        raise _refused(exc) from None
    return {"next_firings": [t.isoformat() for t in times]}


@router.get(
    SCHEDULE,
    url_name="schedule-detail",
    response={200: schemas.Schedule, **errors()},
    summary="Get a schedule",
)
def schedule_detail(request: HttpRequest, instance_id: Id, schedule_id: Id) -> Any:
    return schedule_json(_schedule(request, instance_id, schedule_id))


@router.patch(
    SCHEDULE,
    url_name="schedule-detail",
    response={200: schemas.Schedule, **errors()},
    summary="Change a schedule (only the fields given); active: false pauses it",
)
def schedule_change(
    request: HttpRequest, instance_id: Id, schedule_id: Id, payload: schemas.ScheduleChange
) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    try:
        schedule = scheduling.schedule_change(
            user=request.user,
            schedule=schedule,
            changes=payload.model_dump(exclude_unset=True),
            request=request,
        )
    except TriggerRefused as exc:
        raise _refused(exc) from None
    return schedule_json(schedule)


@router.delete(
    SCHEDULE,
    url_name="schedule-detail",
    response={200: schemas.Deleted, **errors()},
    summary="Delete a schedule",
)
def schedule_delete(request: HttpRequest, instance_id: Id, schedule_id: Id) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    scheduling.schedule_delete(user=request.user, schedule=schedule, request=request)
    return {"deleted": schedule_id}


@router.post(
    SCHEDULE + "/run",
    url_name="schedule-run",
    response={201: schemas.Firing, **errors()},
    summary="Fire the schedule now (within its budget, whatever its overlap policy); the firing says what it did",
)
def schedule_run_now(request: HttpRequest, instance_id: Id, schedule_id: Id, payload: Empty = NO_BODY) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    try:
        firing = scheduling.run_now(user=request.user, schedule=schedule, request=request)
    except TriggerRefused as exc:
        raise _refused(exc) from None
    return Status(201, firing_json(firing))


@router.get(
    SCHEDULE + "/firings",
    url_name="schedule-firings",
    response={200: schemas.Firings, **errors()},
    summary=f"The schedule's latest firings (at most {FIRINGS_SHOWN}): started, skipped and why, missed",
)
def schedule_firings(request: HttpRequest, instance_id: Id, schedule_id: Id) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    return {"firings": [firing_json(f) for f in schedule.firings.all()[:FIRINGS_SHOWN]]}
