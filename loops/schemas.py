"""The schemas of the run API: what each route takes (and refuses) and what it answers.

Bounds come from `tether.limits` (iterations, wall clock, lengths, dollars), stated once; the
console's forms validate through these schemas too (`web.console.forms`). Answers are checked against these schemas
before they leave, so /v1/openapi.json describes what a client really gets.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import BeforeValidator, Field, ValidationError, model_validator

from loops.models import Run as RunModel
from tether.limits import (
    CAP_DIGITS,
    MAX_ITERATIONS,
    MAX_MINUTES,
    MESSAGE_MAX_CHARS,
    NAME_MAX_CHARS,
    OBJECTIVE_MAX_CHARS,
    PROMPT_MAX_CHARS,
    TARGET_MAX_CHARS,
)
from tether.schema import SOMETHING, Body, describe, flag, refuse, text, usd, whole

Iterations = whole(1, MAX_ITERATIONS)
Minutes = whole(1, MAX_MINUTES, unit=" of minutes", description="a wall-clock limit in minutes")
Cap = usd(CAP_DIGITS)
ChildCap = usd(CAP_DIGITS, required=True, description="the child's budget, carved from yours")
Objective = text(
    nonblank=True,
    max_length=OBJECTIVE_MAX_CHARS,
    description="at most the instance's objective_max_chars; a CRLF counts as one character",
)
Message = text(max_length=MESSAGE_MAX_CHARS)
SaidMessage = text(nonblank=True, max_length=MESSAGE_MAX_CHARS)  # a message that must say something
Target = text(nonblank=True, max_length=TARGET_MAX_CHARS)  # an instance (name or id), a template or a role


# A state a run's workspace can be rolled back to (`reviews.rollback`): the one spelling of the names.
ROLLBACK_POINT = "start|verified|iteration-[1-9][0-9]{0,5}|rollback-[1-9][0-9]{0,5}"
ROLLBACK_POINT_HELP = "one of start, verified, iteration-N (as iteration N left it) or rollback-K (as rollback K found it)"


def _rollback_point(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(ROLLBACK_POINT, value):
        raise refuse(f"must be {ROLLBACK_POINT_HELP}; got {value!r}")
    return value


RollbackPoint = Annotated[
    str,
    BeforeValidator(_rollback_point),
    Field(json_schema_extra={"pattern": f"^({ROLLBACK_POINT})$"}, description=ROLLBACK_POINT_HELP),
]


class Error(Schema):
    """Every refusal: what to change, and the field at fault when there is one."""

    error: str
    field: str | None = None


class RunIn(Body):
    objective: Objective  # type: ignore[valid-type]
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    max_cost_usd: Cap = None  # type: ignore[valid-type]
    max_minutes: Minutes | None = None  # type: ignore[valid-type]


class RunContinueIn(Body):
    message: (
        text(  # type: ignore[valid-type]
            max_length=MESSAGE_MAX_CHARS,
            description="folded into the new run's first instruction, like an interjection",
        )
        | None
    ) = None
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    max_cost_usd: Cap = None  # type: ignore[valid-type]
    max_minutes: Minutes | None = None  # type: ignore[valid-type]


class ResumeIn(Body):
    max_cost_usd: Cap = None  # type: ignore[valid-type]


class Interjection(Body):
    message: Message | None = None  # type: ignore[valid-type]
    approve: flag(description="answer a run parked on a tool call needing approval") | None = None  # type: ignore[valid-type]

    model_config = {
        "json_schema_extra": {
            "anyOf": [
                {"required": ["message"], "properties": {"message": {"type": "string", "pattern": SOMETHING}}},
                {"required": ["approve"], "properties": {"approve": {"type": "boolean"}}},
            ],
        },
    }

    @model_validator(mode="after")
    def _says_something(self) -> Interjection:
        if not (self.message or "").strip() and self.approve is None:
            raise refuse("missing required field(s): message")
        return self


class DelegateIn(Body):
    """A `delegate` call's arguments, whoever makes it: the Claude brain's tool, an act's MCP endpoint.

    Its numbers and text are a run's (`RunIn`): the same value gets the same answer on every surface.
    """

    to: Target  # type: ignore[valid-type]
    objective: Objective  # type: ignore[valid-type]
    max_cost_usd: ChildCap  # type: ignore[valid-type]
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    workspace: Literal["own", "copy", "shared"] | None = None


class Invalid(ValueError):
    """Arguments a schema refuses; the message is `tether.schema.describe`'s sentence (what REST answers)."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def checked[B: Body](schema: type[B], arguments: Any) -> B:
    """Return `arguments` validated by `schema`, or raise Invalid with the sentence REST would answer."""
    if not isinstance(arguments, dict):
        raise Invalid("the arguments must be a JSON object", None)
    try:
        return schema.model_validate(arguments)
    except ValidationError as exc:
        message, field = describe(exc.errors(include_url=False), schema.model_fields)
        raise Invalid(message, field) from None


class Empty(Body):
    """No fields: the action needs none."""


class DecideCheck(Body):
    name: text(max_length=NAME_MAX_CHARS)  # type: ignore[valid-type]
    passed: flag()  # type: ignore[valid-type]
    required: flag() = True  # type: ignore[valid-type]
    output: text(max_length=PROMPT_MAX_CHARS) = ""  # type: ignore[valid-type]


class DecideIn(Body):
    objective: text(nonblank=True, max_length=OBJECTIVE_MAX_CHARS)  # type: ignore[valid-type]
    response: text() | None = None  # type: ignore[valid-type]
    instruction: text() | None = None  # type: ignore[valid-type]
    act_ok: flag() | None = None  # type: ignore[valid-type]
    act_detail: text() | None = None  # type: ignore[valid-type]
    checks: list[DecideCheck] | None = None
    history: list[dict[str, Any]] | None = None
    iteration: whole(0, MAX_ITERATIONS) | None = None  # type: ignore[valid-type]
    max_iterations: Iterations | None = None  # type: ignore[valid-type]
    recent_instructions: list[text()] | None = None  # type: ignore[valid-type]


class Decision(Schema):
    verdict: str
    reason: str
    next_instruction: str | None
    decider: str
    usage: dict[str, Any] | None


class RunOrigin(Schema):
    """How the run started; a schedule's firing or a trigger's delivery is named."""

    kind: str = Field(json_schema_extra={"enum": list(RunModel.Origin.values)})
    schedule: int | None = None
    firing: int | None = None
    trigger: int | None = None
    delivery: str | None = None
    parent: int | None = None


class Run(Schema):
    id: int
    instance: int
    objective: str
    origin: RunOrigin
    status: str = Field(json_schema_extra={"enum": list(RunModel.Status.values)})
    outcome: str | None = Field(json_schema_extra={"enum": [*RunModel.Outcome.values, None]})
    outcome_detail: str | None
    verified: bool | None
    iterations: int
    max_iterations: int
    spent_usd: str
    max_cost_usd: str | None
    stop_requested: bool
    last_seq: int
    created_at: str
    started_at: str | None
    finished_at: str | None
    continued_from: int | None = None
    continued_as: int | None = None
    parent: int | None = None
    children: list[int]


class RunDetail(Run):
    budget: dict[str, Any]


class Runs(Schema):
    runs: list[Run]


class Interjected(Schema):
    interjection: int
    run: Run


class Event(Schema):
    seq: int
    kind: str
    at: str
    data: Any


class Events(Schema):
    events: list[Event]
    last_seq: int
    more: bool


class Costs(Schema):
    run: int
    spent_usd: str
    spent_micros: int
    iterations: list[dict[str, Any]]
    earlier: int | None
    budget: dict[str, Any]


class Pools(Schema):
    pools: list[dict[str, Any]]


DryRun = flag(description="say what the rollback would change and leave, and change nothing")


class RollbackIn(Body):
    to: RollbackPoint
    dry_run: DryRun = False  # type: ignore[valid-type]


class Named(Schema):
    paths: list[str]
    more: int


class RollbackPointOut(Schema):
    to: str
    label: str
    run: int = Field(description="the run whose snapshots hold it")
    tree: str


class RollbackPoints(Schema):
    run: int
    points: list[RollbackPointOut]
    live_run: int | None = Field(description="a run on this workspace that is not finished: rollback waits for it")
    offer: str | None = Field(description="the point the run page offers first (the last verified state, after a bound or a stop)")


class RolledBack(Schema):
    to: str
    label: str
    tree: str
    rolled_back: bool = Field(description="false for a dry run")
    undo: str | None = Field(description="the point that returns the workspace to how it was before this rollback")
    exact: bool | None = Field(description="the workspace's snapshot is now exactly the chosen one")
    added: Named
    modified: Named
    deleted: Named
    kept: Named = Field(description="in the workspace but not in its snapshot (a repository's .git, skipped "
                        "directories, what .gitignore hides past its limits, FIFOs): left as they are")
    not_restored: Named = Field(description="'path: why' for each path that could not be written")
