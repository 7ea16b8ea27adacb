"""When a schedule fires: a cron expression (croniter) or an interval, in the schedule's own time zone.

Pure: no database. `check_cron`, `check_time_zone` and `check_interval` refuse what a schedule
cannot use with a sentence (`TimingError`); `times_after` lists the firing times after a
moment, in UTC, inside the schedule's start and end dates (none past the last date a calendar holds).
Start and end dates lie at most `SCHEDULE_HORIZON_DAYS` (~10 years) ahead. Cron is read in the schedule's time
zone, so `0 9 * * 1-5` is 09:00 on weekdays there, across daylight-saving changes.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError, croniter

from tether.limits import SCHEDULE_HORIZON_DAYS, SCHEDULE_INTERVAL_MINUTES

CRON_MAX_CHARS = 100
TIME_ZONE_MAX_CHARS = 64


class TimingError(ValueError):
    """A cron expression, interval or time zone a schedule cannot use; `message` says why."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def check_cron(expression: str) -> str:
    """Return the cron expression tidied (single spaces); TimingError unless it is five valid fields."""
    text = " ".join((expression or "").split())
    if len(text) > CRON_MAX_CHARS:
        raise TimingError(f"a cron expression is at most {CRON_MAX_CHARS} characters", "cron")
    if len(text.split(" ")) != 5:
        raise TimingError(
            f"{text!r} is not a cron expression: give five fields, minute hour day-of-month month "
            "day-of-week (like '0 9 * * 1-5')",
            "cron",
        )
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except (CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError, ValueError, KeyError) as exc:
        raise TimingError(f"{text!r} is not a valid cron expression: {exc}", "cron") from None
    return text


def check_time_zone(name: str) -> zoneinfo.ZoneInfo:
    """Return the IANA time zone `name` (like Europe/Paris); TimingError if there is no such zone."""
    name = (name or "").strip()
    if not name or len(name) > TIME_ZONE_MAX_CHARS or name.startswith(("/", ".")) or ".." in name:
        raise TimingError(
            f"{name!r} is not a time zone: give an IANA name like Europe/Paris or UTC", "timezone"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise TimingError(
            f"{name!r} is not a time zone: give an IANA name like Europe/Paris or UTC", "timezone"
        ) from None


def check_horizon(moment: datetime | None, field: str) -> datetime | None:
    """Return `moment`; TimingError if it lies more than `SCHEDULE_HORIZON_DAYS` (~10 years) from now."""
    if moment is None:
        return None
    horizon = datetime.now(UTC) + timedelta(days=SCHEDULE_HORIZON_DAYS)
    if moment > horizon:
        raise TimingError(
            f"{field} must be at most {SCHEDULE_HORIZON_DAYS // 365} years from now "
            f"(before {horizon.date().isoformat()}); got {moment.isoformat()}",
            field,
        )
    return moment


def check_interval(minutes: int) -> int:
    low, high = SCHEDULE_INTERVAL_MINUTES
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not low <= minutes <= high:
        raise TimingError(
            f"interval_minutes must be a whole number of minutes from {low} to {high}; got {minutes!r}",
            "interval_minutes",
        )
    return minutes


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: exactly one of `cron` and `interval_minutes`, read in `time_zone`."""

    cron: str
    interval_minutes: int | None
    time_zone: str
    starts_at: datetime | None
    ends_at: datetime | None
    anchor: datetime  # an interval counts from here (the start date, else when the schedule was made)

    @classmethod
    def checked(
        cls,
        *,
        cron: str | None,
        interval_minutes: int | None,
        time_zone: str,
        starts_at: datetime | None,
        ends_at: datetime | None,
        anchor: datetime,
    ) -> Timing:
        """Return the timing, each part checked; TimingError naming the field that is wrong."""
        has_cron = bool((cron or "").strip())
        if has_cron == (interval_minutes is not None):
            raise TimingError(
                "give either a cron expression or interval_minutes, not both and not neither", "cron"
            )
        check_time_zone(time_zone)
        check_horizon(starts_at, "starts_at")
        check_horizon(ends_at, "ends_at")
        if starts_at is not None and ends_at is not None and ends_at <= starts_at:
            raise TimingError("ends_at must be after starts_at", "ends_at")
        return cls(
            cron=check_cron(cron or "") if has_cron else "",
            interval_minutes=None if interval_minutes is None else check_interval(interval_minutes),
            time_zone=time_zone.strip(),
            starts_at=starts_at,
            ends_at=ends_at,
            anchor=starts_at or anchor,
        )

    def _candidates(self, after: datetime) -> Iterator[datetime]:
        if self.starts_at is not None and after < self.starts_at:
            after = self.starts_at - timedelta(microseconds=1)
        if self.interval_minutes is not None:
            step = timedelta(minutes=self.interval_minutes)
            passed = max(0, (after - self.anchor) // step + 1)
            moment = self.anchor + passed * step
            while True:
                yield moment.astimezone(UTC)
                moment += step
        else:
            local = after.astimezone(zoneinfo.ZoneInfo(self.time_zone))
            times = croniter(self.cron, local)
            while True:
                yield times.get_next(datetime).astimezone(UTC)

    def times_after(
        self, after: datetime, *, until: datetime | None = None, limit: int = 5
    ) -> list[datetime]:
        """Return up to `limit` firing times strictly after `after` (and at most `until`), earliest first, in UTC."""
        found: list[datetime] = []
        try:
            for moment in self._candidates(after):
                if len(found) >= limit or (until is not None and moment > until):
                    break
                if self.ends_at is not None and moment > self.ends_at:
                    break
                if moment > after:
                    found.append(moment)
        except (OverflowError, CroniterBadDateError):
            pass  # past the last date a calendar can hold (a row stored before the horizon check): no more firings
        return found

    def next_after(self, after: datetime) -> datetime | None:
        found = self.times_after(after, limit=1)
        return found[0] if found else None
