"""The schemas of the trigger and schedule API: what creating or changing one takes, and what it answers.

Bounds come from `tether.limits`; the console's form validates through these schemas too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AwareDatetime, BeforeValidator, Field

from loops.objective_template import TemplateError, fields
from loops.schemas import Cap, Iterations
from tether.limits import (
    HOOK_RATE,
    NAME_MAX_CHARS,
    OBJECTIVE_MAX_CHARS,
    SCHEDULE_CATCH_UP_MINUTES,
    SCHEDULE_INTERVAL_MINUTES,
)
from tether.schema import SPACE, Body, clean_text, flag, refuse, text, whole
from triggers import models

Name = text(nonblank=True, max_length=NAME_MAX_CHARS)
Word = text(nonblank=True, max_length=NAME_MAX_CHARS)
Rate = whole(
    *HOOK_RATE, description="runs the trigger may start in a minute; more deliveries are refused (429)"
)

# The template's syntax as a JSON Schema pattern, so the document says what the parser takes
# (`loops.objective_template`): text, `{{` / `}}`, and fields `{a.b.0}` whose parts do not start with
# `__`, with at least one character that is not white space.
_PART = "(?:[A-Za-z0-9-][A-Za-z0-9_-]*|_(?:[A-Za-z0-9-][A-Za-z0-9_-]*)?)"
_FIELD = f"\\{{{_PART}(?:\\.{_PART})*\\}}"
_TOKEN = f"(?:[^{{}}\\u0000]|\\{{\\{{|\\}}\\}}|{_FIELD})"
_SOLID = f"(?:[^{{}}{SPACE}\\u0000]|\\{{\\{{|\\}}\\}}|{_FIELD})"
TEMPLATE_PATTERN = f"^{_TOKEN}*{_SOLID}{_TOKEN}*$"


def _template(value: Any) -> str:
    value = clean_text(value, max_length=OBJECTIVE_MAX_CHARS, nonblank=True)
    try:
        fields(value)
    except TemplateError as exc:
        raise refuse(exc.message) from None
    return value


def template(names: str) -> Any:
    """An objective template: checked as `loops.objective_template` parses it, its syntax in the document;
    `names`: what its braces may name."""
    return Annotated[
        str,
        BeforeValidator(_template),
        Field(
            json_schema_extra={"pattern": TEMPLATE_PATTERN, "minLength": 1, "maxLength": OBJECTIVE_MAX_CHARS},
            description=f"the objective, with {names}; {{{{ and }}}} are literal braces",
        ),
    ]


Template = template("{dotted.paths} into the delivery's JSON payload (e.g. {issue.title})")
Events = Annotated[
    list[Word],  # type: ignore[valid-type]
    Field(
        max_length=50,
        description="the events that start a run (X-GitHub-Event / X-Tether-Event, e.g. issues); empty: any",
    ),
]
Actions = Annotated[
    list[Word],  # type: ignore[valid-type]
    Field(
        max_length=50, description="the payload's `action` values that start a run (e.g. opened); empty: any"
    ),
]


class TriggerIn(Body):
    name: Name  # type: ignore[valid-type]
    objective_template: Template  # type: ignore[valid-type]
    events: Events | None = None
    actions: Actions | None = None
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    max_cost_usd: Cap = None  # type: ignore[valid-type]
    max_per_minute: Rate | None = None  # type: ignore[valid-type]


class TriggerChange(Body):
    """The fields of a trigger to change (absent or null: as it is)."""

    name: Name | None = None  # type: ignore[valid-type]
    objective_template: Template | None = None  # type: ignore[valid-type]
    events: Events | None = None
    actions: Actions | None = None
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    max_cost_usd: Cap = None  # type: ignore[valid-type]
    max_per_minute: Rate | None = None  # type: ignore[valid-type]
    active: flag(description="false pauses the trigger: deliveries are refused (409)") | None = None  # type: ignore[valid-type]


class Trigger(Schema):
    id: int
    instance: int
    name: str
    url: str
    objective_template: str
    events: list[str]
    actions: list[str]
    max_iterations: int | None
    max_cost_usd: str | None
    max_per_minute: int
    active: bool
    secret_set_at: str
    created_at: str


class TriggerWithSecret(Trigger):
    secret: str


class Triggers(Schema):
    triggers: list[Trigger]


class Delivery(Schema):
    id: int
    delivery_id: str
    event: str
    received_at: str
    outcome: str
    status: int
    reason: str
    run: int | None
    headers: dict[str, str]
    body_excerpt: str
    body_bytes: int


class Deliveries(Schema):
    deliveries: list[Delivery]


class Deleted(Schema):
    deleted: int


# --- schedules --------------------------------------------------------------------------------------

Cron = text(
    max_length=100,
    description="five cron fields read in `timezone`, e.g. 0 9 * * 1-5; or give interval_minutes",
)
Interval = whole(
    *SCHEDULE_INTERVAL_MINUTES, unit=" of minutes", description="fire every this many minutes; or give cron"
)
TimeZone = text(
    nonblank=True, max_length=64, description="an IANA time zone, e.g. Europe/Paris (default UTC)"
)
CatchUp = whole(
    *SCHEDULE_CATCH_UP_MINUTES,
    unit=" of minutes",
    description="after downtime, the latest missed firing at most this old still runs, once; 0: only on-time firings",
)
OverlapPolicy = Literal[tuple(models.Schedule.Overlap.values)]  # type: ignore[valid-type]  # the model's choices
ScheduleTemplate = template("{date}, {time}, {schedule.name}, {last_run.id} or {last_run.outcome}")


class ScheduleTiming(Body):
    cron: Cron | None = None  # type: ignore[valid-type]
    interval_minutes: Interval | None = None  # type: ignore[valid-type]
    timezone: TimeZone | None = None  # type: ignore[valid-type]
    starts_at: AwareDatetime | None = None
    ends_at: AwareDatetime | None = None


class ScheduleIn(ScheduleTiming):
    name: Name  # type: ignore[valid-type]
    objective_template: ScheduleTemplate  # type: ignore[valid-type]
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    max_cost_usd: Cap = None  # type: ignore[valid-type]
    overlap: OverlapPolicy = "skip"  # type: ignore[valid-type]
    catch_up_minutes: CatchUp | None = None  # type: ignore[valid-type]
    active: flag(description="false: made paused") | None = None  # type: ignore[valid-type]


class ScheduleChange(ScheduleTiming):
    """The fields of a schedule to change (absent or null: as it is)."""

    name: Name | None = None  # type: ignore[valid-type]
    objective_template: ScheduleTemplate | None = None  # type: ignore[valid-type]
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    max_cost_usd: Cap = None  # type: ignore[valid-type]
    overlap: OverlapPolicy | None = None  # type: ignore[valid-type]
    catch_up_minutes: CatchUp | None = None  # type: ignore[valid-type]
    active: flag(description="false pauses the schedule; true resumes it from now") | None = None  # type: ignore[valid-type]


class Schedule(Schema):
    id: int
    instance: int
    name: str
    objective_template: str
    cron: str | None
    interval_minutes: int | None
    timezone: str
    starts_at: str | None
    ends_at: str | None
    max_iterations: int | None
    max_cost_usd: str | None
    overlap: str
    catch_up_minutes: int
    active: bool
    next_firings: list[str]
    created_at: str


class Schedules(Schema):
    schedules: list[Schedule]


class Preview(Schema):
    next_firings: list[str]


class Firing(Schema):
    id: int
    scheduled_for: str
    fired_at: str
    outcome: str
    reason: str
    manual: bool
    run: int | None


class Firings(Schema):
    firings: list[Firing]
