"""REST: an instance's schedules (a ninja Router mounted by web.api_urls, beside the trigger API's).

Only the instance's owner sees or changes its schedules: anyone else's instance or schedule id
answers 404, as for triggers, instances and runs. Every write goes through `triggers.scheduling`.
A bad cron expression, interval or time zone is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Body, Router, Status

from loops.schemas import Empty
from triggers import scheduling, schemas
from triggers.api import listed, owned
from triggers.models import Firing, Schedule
from triggers.services import cap_usd, delete_with
from web.api import owned_instance
from web.rest import Id, route

router = Router(tags=["triggers", "schedules"])  # listed with the triggers, and on their own

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
        "max_cost_usd": cap_usd(schedule),
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
    return owned(request, Schedule, instance_id, schedule_id)


@route(router.get, SCHEDULES, "schedules", schemas.Schedules, "List the instance's schedules")
def schedule_list(request: HttpRequest, instance_id: Id) -> Any:
    return listed(request, Schedule, instance_id, schedule_json)


@route(router.post, SCHEDULES, "schedules", schemas.Schedule, "Create a schedule", status=201)
def schedule_create(request: HttpRequest, instance_id: Id, payload: schemas.ScheduleIn) -> Any:
    instance = owned_instance(request, instance_id)
    values = payload.model_dump(exclude_none=True)
    schedule = scheduling.schedule_create(user=request.user, instance=instance, request=request, **values)
    return Status(201, schedule_json(schedule))


@route(
    router.post, SCHEDULES + "/preview", "schedule-preview", schemas.Preview,
    "The next 5 firing times of a schedule's timing, before it is saved",
)
def schedule_preview(request: HttpRequest, instance_id: Id, payload: schemas.ScheduleTiming) -> Any:
    owned_instance(request, instance_id)
    times = scheduling.preview(payload.model_dump(exclude_none=True))
    return {"next_firings": [t.isoformat() for t in times]}


@route(router.get, SCHEDULE, "schedule-detail", schemas.Schedule, "Get a schedule")
def schedule_detail(request: HttpRequest, instance_id: Id, schedule_id: Id) -> Any:
    return schedule_json(_schedule(request, instance_id, schedule_id))


@route(
    router.patch, SCHEDULE, "schedule-detail", schemas.Schedule,
    "Change a schedule (only the fields given); active: false pauses it",
)
def schedule_change(
    request: HttpRequest, instance_id: Id, schedule_id: Id, payload: schemas.ScheduleChange
) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    schedule = scheduling.schedule_change(
        user=request.user,
        schedule=schedule,
        changes=payload.model_dump(exclude_unset=True),
        request=request,
    )
    return schedule_json(schedule)


@route(router.delete, SCHEDULE, "schedule-detail", schemas.Deleted, "Delete a schedule")
def schedule_delete(request: HttpRequest, instance_id: Id, schedule_id: Id) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    return delete_with(scheduling.schedule_delete, request.user, schedule, request=request)


@route(
    router.post, SCHEDULE + "/run", "schedule-run", schemas.Firing,
    "Fire the schedule now (within its budget, whatever its overlap policy); the firing says what it did",
    status=201,
)
def schedule_run_now(request: HttpRequest, instance_id: Id, schedule_id: Id, payload: Empty = NO_BODY) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    firing = scheduling.run_now(user=request.user, schedule=schedule, request=request)
    return Status(201, firing_json(firing))


@route(
    router.get, SCHEDULE + "/firings", "schedule-firings", schemas.Firings,
    f"The schedule's latest firings (at most {FIRINGS_SHOWN}): started, skipped and why, missed",
)
def schedule_firings(request: HttpRequest, instance_id: Id, schedule_id: Id) -> Any:
    schedule = _schedule(request, instance_id, schedule_id)
    return {"firings": [firing_json(f) for f in schedule.firings.all()[:FIRINGS_SHOWN]]}
