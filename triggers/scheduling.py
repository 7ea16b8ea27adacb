"""Schedules: what people do to them (create, change, pause, delete, run now) and what a firing does.

The tick (`tick`, called every minute by django-q2's scheduler through `triggers.tasks.tick`)
hands each schedule whose `next_fire_at` has come to `fire_due`. That works in one transaction
on the schedule's row, locked: it records every firing since the last one handled as a `Firing`
row, unique per (schedule, scheduled time), and starts at most one run, through
`loops.services.run_start`, in that same transaction. Two worker clusters ticking at once, or a
cluster killed while it fires, therefore give each firing exactly one outcome: the transaction of
a killed cluster rolls back whole, and a second cluster finds the row made or makes it itself.

Every decision takes `now` as an argument (the tests move the clock instead of waiting):

- a firing up to `GRACE` late, or up to the catch-up window late, is on time; of several due
  firings only the latest starts a run (one catch-up run after downtime, never a burst) and the
  others are recorded as missed;
- when a run of the schedule is still live, the overlap policy decides (`Schedule.Overlap`);
- a firing whose pools cannot cover the run's cap is recorded as skipped, and its owner is told.

The objective is the schedule's template filled from `{date, time, schedule, last_run}` and
nothing else; the instance, its tools, workspace and budget are the schedule's own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import trail
from budgets import money
from budgets import services as budget_services
from budgets.selectors import headroom_for_pool
from loops import objective_template, services
from loops.models import Run
from reviews import notify
from tether import redaction
from tether.limits import FIRINGS_KEPT, SCHEDULE_MISSED_RECORDED
from triggers.models import Firing, Schedule
from triggers.services import (
    TriggerRefused,
    changed_cap,
    check_instance,
    check_owner,
    delete_owned,
    detail,
    keep_newest,
    render_objective,
    save_changed,
    save_created,
    source_fields,
    start_run,
    stored,
)
from triggers.timing import Timing, TimingError

log = logging.getLogger(__name__)

# django-q2's scheduler looks for due schedules about every 30 s and the tick's own schedule is every
# minute: a firing handled this late is on time, whatever its catch-up window.
GRACE = timedelta(minutes=2)
LIVE = (Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING)
PREVIEWED = 5
DUE_SCAN_MAX = 200_000  # firing times looked at after downtime (a minutely schedule: 138 days)


# --- people's changes -------------------------------------------------------------------------------


def timing_of(values: Mapping[str, Any], *, anchor: datetime) -> Timing:
    """Return the timing `values` describe (cron or interval_minutes, timezone, starts_at, ends_at); TriggerRefused 400."""
    try:
        return Timing.checked(
            cron=values.get("cron"),
            interval_minutes=values.get("interval_minutes"),
            time_zone=values.get("timezone") or "UTC",
            starts_at=values.get("starts_at"),
            ends_at=values.get("ends_at"),
            anchor=anchor,
        )
    except TimingError as exc:
        raise TriggerRefused(exc.message, 400, exc.field) from None


def schedule_timing(schedule: Schedule) -> Timing:
    return Timing(
        cron=schedule.cron,
        interval_minutes=schedule.interval_minutes,
        time_zone=schedule.timezone,
        starts_at=schedule.starts_at,
        ends_at=schedule.ends_at,
        anchor=schedule.starts_at or schedule.created_at,
    )


def preview(
    values: Mapping[str, Any], *, now: datetime | None = None, count: int = PREVIEWED
) -> list[datetime]:
    """Return the next `count` firing times of a schedule described by `values` (not saved), in UTC."""
    now = now or timezone.now()
    return timing_of(values, anchor=now).times_after(now, limit=count)


def next_firings(
    schedule: Schedule, *, now: datetime | None = None, count: int = PREVIEWED
) -> list[datetime]:
    """Return a saved schedule's next `count` firing times (none while it is paused)."""
    if not schedule.active or schedule.next_fire_at is None:
        return []
    first = schedule.next_fire_at
    return [first, *schedule_timing(schedule).times_after(first, limit=count - 1)]


TIMING = ("cron", "interval_minutes", "timezone", "starts_at", "ends_at")
CHANGEABLE = (
    "name",
    "objective_template",
    *TIMING,
    "max_iterations",
    "overlap",
    "catch_up_minutes",
    "active",
)


def _overlap(value: Any) -> str:
    if value not in Schedule.Overlap.values:
        raise TriggerRefused(
            f"overlap must be one of {', '.join(Schedule.Overlap.values)}; got {value!r}", 400, "overlap"
        )
    return str(value)


def schedule_create(
    *,
    user: Any,
    instance: Any,
    name: str,
    objective_template: str,
    cron: str | None = None,
    interval_minutes: int | None = None,
    timezone: str = "UTC",
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    max_iterations: int | None = None,
    max_cost_usd: Any = None,
    overlap: str = Schedule.Overlap.SKIP,
    catch_up_minutes: int = 0,
    active: bool = True,
    via: str = "api",
    request: Any = None,
    now: datetime | None = None,
) -> Schedule:
    """Create a schedule on `user`'s `instance`; its first firing is the first time after `now`."""
    now = now or _now()
    check_instance(user, instance)
    timing = timing_of(
        {
            "cron": cron,
            "interval_minutes": interval_minutes,
            "timezone": timezone,
            "starts_at": starts_at,
            "ends_at": ends_at,
        },
        anchor=now,
    )
    schedule = Schedule(
        **source_fields(user, instance, name, objective_template, max_iterations, max_cost_usd),
        cron=timing.cron,
        interval_minutes=timing.interval_minutes,
        timezone=timing.time_zone,
        starts_at=starts_at,
        ends_at=ends_at,
        overlap=_overlap(overlap),
        catch_up_minutes=catch_up_minutes or 0,
        active=active,
        created_at=now,
    )
    schedule.next_fire_at = schedule_timing(schedule).next_after(now) if active else None
    save_created(user, schedule, via, request, when=schedule.when(), objective_template=schedule.objective_template[:500])
    return schedule


def schedule_change(
    *,
    user: Any,
    schedule: Schedule,
    changes: Mapping[str, Any],
    via: str = "api",
    request: Any = None,
    now: datetime | None = None,
) -> Schedule:
    """Change `user`'s schedule (None leaves a field as it is); `active` False pauses it.

    A changed timing, or a resume, counts from `now`: what a paused schedule would have fired is
    not caught up.
    """
    now = now or _now()
    check_owner(user, schedule)
    changed: dict[str, Any] = {}
    for name in CHANGEABLE:
        if name not in changes or (changes[name] is None and name not in TIMING):
            continue  # None leaves a field as it is; a part of the timing given as None is cleared
        value = changes[name]
        if name == "cron" and value is None:
            value = ""
        value = _overlap(value) if name == "overlap" else stored(name, value)
        if getattr(schedule, name) != value:
            changed[name] = value
    if "cron" in changed and "interval_minutes" not in changes:
        changed["interval_minutes"] = None  # a cron replaces the interval, and the other way round
    if "interval_minutes" in changed and "cron" not in changes:
        changed["cron"] = ""
    changed_cap(schedule, changes, changed)
    if not changed:
        return schedule
    if set(changed) & set(TIMING):
        timing = timing_of(
            {name: changed.get(name, getattr(schedule, name)) for name in TIMING},
            anchor=schedule.created_at,
        )
        changed["cron"], changed["interval_minutes"] = timing.cron, timing.interval_minutes
    save_changed(user, schedule, changed, via, request, then=lambda saved: reschedule(saved, now))
    return schedule


def reschedule(schedule: Schedule, now: datetime) -> None:
    """Count the schedule's firings from `now` (none while paused): a resumed schedule catches nothing up."""
    schedule.next_fire_at = schedule_timing(schedule).next_after(now) if schedule.active else None
    schedule.save(update_fields=["next_fire_at"])


def schedule_delete(*, user: Any, schedule: Schedule, via: str = "api", request: Any = None) -> None:
    """Delete `user`'s schedule and its firings (the runs it started stay)."""
    delete_owned(user, schedule, via, request)


def run_now(
    *, user: Any, schedule: Schedule, via: str = "api", request: Any = None, now: datetime | None = None
) -> Firing:
    """Fire `user`'s schedule now, as a person asked: within its budget, whatever its overlap policy."""
    now = now or _now()
    check_owner(user, schedule)
    problem = _startable_problem(schedule)
    with transaction.atomic():
        locked = Schedule.objects.select_for_update().get(pk=schedule.pk)
        firing = _fire(locked, now, now, problem, manual=True)
        trail.record(
            user=user,
            action="schedule.run_now",
            request=request,
            via=via,
            detail=detail(locked, firing=firing.pk, outcome=firing.outcome, run=firing.run_id),
        )
    return firing


# --- firing ----------------------------------------------------------------------------------------


def _now() -> datetime:
    return timezone.now()


def tick(now: datetime | None = None) -> int:
    """Handle every active schedule that is due at `now` or holds a buffered firing; return the firings made."""
    now = now or _now()
    due = set(Schedule.objects.filter(active=True, next_fire_at__lte=now).values_list("pk", flat=True)) | set(
        Firing.objects.filter(outcome=Firing.Outcome.BUFFERED, schedule__active=True).values_list(
            "schedule_id", flat=True
        )
    )
    made = 0
    for pk in sorted(due):
        try:
            made += len(fire_due(pk, now))
        except Exception:  # one schedule's failure (its firing rolled back, retried next tick) stops no other
            log.exception("firing schedule %s failed; the next tick tries again", pk)
    return made


def fire_due(schedule_id: int, now: datetime | None = None) -> list[Firing]:
    """Record every firing of the schedule due by `now` and start at most one run; [] if another cluster did."""
    now = now or _now()
    schedule = Schedule.objects.select_related("instance").filter(pk=schedule_id, active=True).first()
    if schedule is None:
        return []
    problem = _startable_problem(schedule)  # outside the transaction: it may probe the sandbox
    try:
        with transaction.atomic():
            locked = Schedule.objects.select_for_update().filter(pk=schedule_id, active=True).first()
            if locked is None:
                return []
            made = _release_buffered(locked, now, problem)
            if locked.next_fire_at is not None and locked.next_fire_at <= now:
                made += _due(locked, now, problem)
            _forget_old(locked)
    except IntegrityError:
        # Another cluster recorded these firings first (SQLite, where the row lock is no lock): its run stands.
        return []
    return made


def _due(schedule: Schedule, now: datetime, problem: str) -> list[Firing]:
    timing = schedule_timing(schedule)
    first = schedule.next_fire_at
    assert first is not None
    due = [first, *timing.times_after(first, until=now, limit=DUE_SCAN_MAX)]
    window = max(GRACE, timedelta(minutes=schedule.catch_up_minutes))
    latest = due[-1]
    runs = now - latest <= window
    missed = due[:-1] if runs else due
    made = _missed(schedule, missed, latest if runs else None, now, window)
    if runs:
        made.append(_fire(schedule, latest, now, problem, catch_up=len(due) > 1 or now - latest > GRACE))
    schedule.next_fire_at = timing.next_after(max(now, latest))
    schedule.save(update_fields=["next_fire_at"])
    return made


def _missed(
    schedule: Schedule, times: list[datetime], caught: datetime | None, now: datetime, window: timedelta
) -> list[Firing]:
    """Record missed firings: the latest `SCHEDULE_MISSED_RECORDED` one by one, any older ones as one row."""
    if not times:
        return []
    minutes = schedule.catch_up_minutes

    def why(at: datetime) -> str:
        late = _duration(now - at)
        if caught is not None:
            return (
                f"handled {late} late: the catch-up started the latest missed firing "
                f"({caught.isoformat()}) instead; one catch-up run, never a burst"
            )
        return (
            f"handled {late} late, past the catch-up window of {minutes} minute{'s' if minutes != 1 else ''}"
        )

    older, recent = times[:-SCHEDULE_MISSED_RECORDED], times[-SCHEDULE_MISSED_RECORDED:]
    rows = [
        Firing(
            schedule=schedule, scheduled_for=at, fired_at=now, outcome=Firing.Outcome.MISSED, reason=why(at)
        )
        for at in recent
    ]
    if older:
        rows.insert(
            0,
            Firing(
                schedule=schedule,
                scheduled_for=older[0],
                fired_at=now,
                outcome=Firing.Outcome.MISSED,
                reason=f"{len(older)} firings from {older[0].isoformat()} to {older[-1].isoformat()} were missed "
                f"(the workers were down); {why(older[-1])}",
            ),
        )
    return Firing.objects.bulk_create(rows)


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _live_runs(schedule: Schedule) -> list[Run]:
    ids = Firing.objects.filter(schedule=schedule, run__isnull=False).values_list("run_id", flat=True)
    return list(Run.objects.filter(pk__in=ids, status__in=LIVE).order_by("pk"))


def _fire(
    schedule: Schedule,
    scheduled_for: datetime,
    now: datetime,
    problem: str,
    *,
    manual: bool = False,
    catch_up: bool = False,
) -> Firing:
    """Decide one firing (inside the caller's transaction, the schedule locked) and record it."""
    firing = Firing(schedule=schedule, scheduled_for=scheduled_for, fired_at=now, manual=manual)
    live = [] if manual else _live_runs(schedule)
    if live and schedule.overlap == Schedule.Overlap.SKIP:
        return _record(
            firing,
            Firing.Outcome.SKIPPED,
            f"run {live[-1].pk} of this schedule is still live (overlap: skip)",
        )
    if live and schedule.overlap == Schedule.Overlap.BUFFER_ONE:
        waiting = schedule.firings.filter(outcome=Firing.Outcome.BUFFERED).first()
        if waiting is not None:
            return _record(
                firing,
                Firing.Outcome.SKIPPED,
                f"run {live[-1].pk} is still live and firing {waiting.pk} already waits for it (overlap: buffer_one "
                "keeps one)",
            )
        return _record(
            firing, Firing.Outcome.BUFFERED, f"waits for run {live[-1].pk} to end (overlap: buffer_one)"
        )
    stopped = []
    if live and schedule.overlap == Schedule.Overlap.CANCEL_OTHER:
        for run in live:
            try:
                services.run_cancel(run=run, user=schedule.owner, via="system")
            except services.Refused:
                continue  # it finished meanwhile
            stopped.append(run.pk)
    note = f" (stopped run {', '.join(map(str, stopped))}: overlap cancel_other)" if stopped else ""
    if catch_up:
        note += " (a catch-up: the workers were late or down)"
    return _start(schedule, firing, now, problem, note)


def _record(firing: Firing, outcome: str, reason: str, run: Run | None = None) -> Firing:
    firing.outcome, firing.reason, firing.run = outcome, reason, run
    firing.save()
    return firing


def _release_buffered(schedule: Schedule, now: datetime, problem: str) -> list[Firing]:
    """Start the firing buffered behind a run that has now ended (overlap buffer_one)."""
    waiting = schedule.firings.filter(outcome=Firing.Outcome.BUFFERED).first()
    if waiting is None or _live_runs(schedule):
        return []
    waiting.fired_at = now
    return [_start(schedule, waiting, now, problem, " (buffered until the previous run ended)")]


def _startable_problem(schedule: Schedule) -> str:
    try:
        services.ensure_startable(schedule.instance)
    except services.Refused as exc:
        return exc.message
    return ""


def _budget_problem(schedule: Schedule, now: datetime) -> str:
    """Why the instance's pools cannot cover a run of the schedule ("" when they can)."""
    headroom = headroom_for_pool(budget_services.instance_pool(schedule.instance), now)
    need = schedule.max_cost_micros or 1
    if headroom.remaining is None or headroom.remaining >= need or headroom.limiting is None:
        return ""
    pool = headroom.limiting
    span = "limit" if pool.period == "none" else f"{pool.period} period"
    return (
        f"the pool {pool.name!r} has {money.format_usd(headroom.remaining)} of its "
        f"{money.format_usd(pool.limit)} {span} left; "
        + (
            f"a run of this schedule may cost up to {money.format_usd(need)}"
            if schedule.max_cost_micros
            else "nothing is left for a run"
        )
    )


def _template_data(schedule: Schedule, scheduled_for: datetime) -> dict[str, Any]:
    local = scheduled_for.astimezone(ZoneInfo(schedule.timezone))
    last = (
        Firing.objects.filter(schedule=schedule, run__isnull=False)
        .select_related("run")
        .order_by("-fired_at", "-pk")
        .first()
    )
    last_run = {"id": None, "outcome": None}
    if last is not None and last.run is not None:
        last_run = {"id": last.run.pk, "outcome": last.run.outcome or last.run.status}
    return {
        "date": local.date().isoformat(),
        "time": local.strftime("%H:%M"),
        "schedule": {"id": schedule.pk, "name": schedule.name},
        "last_run": last_run,
    }


def _start(schedule: Schedule, firing: Firing, now: datetime, problem: str, note: str = "") -> Firing:
    if problem:
        return _record(firing, Firing.Outcome.SKIPPED, problem)
    if why := _budget_problem(schedule, now):
        firing = _record(firing, Firing.Outcome.SKIPPED, why)
        notify.notify_firing_skipped(
            owner_id=schedule.owner_id,
            key=f"schedule.skipped:schedule:{schedule.pk}:{firing.scheduled_for.isoformat()}",
            schedule={
                "id": schedule.pk,
                "name": schedule.name,
                "instance": schedule.instance_id,
                "instance_name": schedule.instance.name,
                "scheduled_for": firing.scheduled_for.isoformat(),
            },
            reason=why,
        )
        return firing
    try:
        objective = render_objective(schedule, _template_data(schedule, firing.scheduled_for))
    except objective_template.TemplateError as exc:
        return _record(
            firing, Firing.Outcome.SKIPPED, f"the objective template cannot be filled: {exc.message}"
        )
    firing.outcome, firing.reason = Firing.Outcome.STARTED, ""
    firing.save()  # its id names it in the run's origin; a second cluster's copy fails the unique key here
    origin = services.Origin(Run.Origin.SCHEDULE, {"schedule": schedule.pk, "firing": firing.pk})
    try:
        run = start_run(schedule, redaction.redact(objective), origin)
    except services.Refused as exc:
        return _record(firing, Firing.Outcome.SKIPPED, exc.message)
    return _record(firing, Firing.Outcome.STARTED, f"started run {run.pk}{note}", run)


def _forget_old(schedule: Schedule) -> None:
    keep_newest(Firing.objects.filter(schedule=schedule), FIRINGS_KEPT)
