"""The payload of each event kind, typed: one pydantic model per kind, and the registry of them.

A run's timeline is read for years by pages, receipts, the API and the tests; what each kind
carries is declared here once. `loops.events` validates every payload it writes against its
kind's model (`check`), so a misspelt field, one too many or a kind nobody declared is refused
at the one writer instead of becoming an event no reader understands. What is stored is the
writer's own data (validation checks it, it does not rewrite it).

Every model forbids fields it does not name and holds each field to its type. Every field but an
iteration-level kind's `iteration` may be absent: an event written by an earlier Tether lacks the
fields added since, and every reader does without (`loops.event_kinds` reads them with defaults).
Nested shapes whose keys come from elsewhere (an act's usage and tool calls, a judge's verdict) are
plain objects. `loops.event_kinds` says how a person reads each kind; the two registries name the
same kinds (a test holds them to it, and to every kind the code writes), and docs/api.md lists them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Payload(BaseModel):
    """What every payload shares: nothing beyond its declared fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class InIteration(Payload):
    iteration: int


class ByWhom(Payload):
    """Who asked for it, and through which surface (`via`: the console, the API, MCP...)."""

    by: str | None = None
    via: str | None = None


class RolledBack(Payload):
    """What taking the workspace back did: `reviews.rollback`'s outcome, for a person or a stall's rewind."""

    label: str | None = None
    undo: str | None = None
    exact: bool | None = None
    added: int | None = None
    modified: int | None = None
    deleted: int | None = None
    not_restored: list[str] | None = None


class Origin(Payload):
    """How the run started: `Run.Origin`'s value, and which schedule, trigger or parent."""

    kind: str
    schedule: int | None = None
    firing: int | None = None
    trigger: int | None = None
    delivery: str | None = None
    parent: int | None = None


class RunStarted(ByWhom):
    objective: str | None = None
    instance: int | None = None
    max_iterations: int | None = None
    max_cost_usd: str | None = None
    origin: Origin | None = None
    continued_from: int | None = None  # a continuation of that run
    parent: int | None = None  # delegated by that run


class RunClaimed(InIteration):
    worker: str | None = None
    attempt: int | None = None


class IterationStarted(InIteration):
    instruction: str | None = None
    interjections: int | None = None
    attempt: int | None = None


class ActStarted(InIteration):
    pass


class ActFinished(InIteration):
    ok: bool | None = None
    detail: str | None = None
    response: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None  # `instances.brains.base.Usage.as_json()`


class CheckResult(Payload):
    name: str | None = None
    required: bool | None = None
    passed: bool | None = None
    output: str | None = None
    evidence: str | None = None
    evidence_detail: str | None = None
    progress: int | None = None


class ChecksFinished(InIteration):
    checks: list[CheckResult] | None = None


class ProtectedChanged(InIteration):
    modified: list[str] | None = None
    added: list[str] | None = None
    deleted: list[str] | None = None
    paths: list[str] | None = None


class GradeFinished(InIteration):
    verified: bool | None = None
    outcome: str | None = None
    review: bool | None = None
    reasons: list[str] | None = None
    response_check: dict[str, Any] | None = None  # `reviews.graders.ResponseCheck.as_json()`
    judge: dict[str, Any] | None = None  # `reviews.judge.Verdict.as_json()`
    unchanged_workspace: bool | None = None


class GradeRole(InIteration):
    passed: bool | None = None
    reason: str | None = None


class DecisionMade(InIteration):
    verdict: str | None = None
    reason: str | None = None


class IterationFinished(InIteration):
    cost_usd: str | None = None
    duration_ms: int | None = None
    act_ok: bool | None = None


class RunDelegating(InIteration):
    calls: int | None = None


class Refusal(Payload):
    to: str | None = None
    error: str | None = None


class RunDelegated(InIteration):
    children: list[int] | None = None
    refused: list[Refusal] | None = None


class ChildStarted(Payload):
    child: int | None = None
    instance: str | None = None


class ChildFinished(ChildStarted):
    outcome: str | None = None
    verified: bool | None = None
    spent_usd: str | None = None


class ChildWaiting(ChildStarted):
    question: str | None = None


class ChildContinued(Payload):
    child: int | None = None
    as_: int | None = Field(default=None, alias="as")
    by: str | None = None


class InterjectionQueued(ByWhom):
    id: int | None = None
    text: str | None = None


class StopRequested(ByWhom):
    pass


class RunWaiting(InIteration):
    question: str | None = None


class RunResumed(ByWhom):
    reason: str | None = None  # "answered", "budget" (by a person), "children finished"
    children: list[int] | None = None


class AttemptLost(InIteration):
    attempt: int | None = None
    worker: str | None = None
    began_at: str | None = None
    lost_at: str | None = None
    reservations: list[int] | None = None
    closed_usd: str | None = None
    changes_unknown: str | None = None  # why what it changed is not known; else `changed` and `more`
    changed: list[dict[str, Any]] | None = None
    more: int | None = None
    tool_calls: list[dict[str, Any]] | None = None  # `loops.journal.calls_of`


class RunReaped(InIteration):
    previous_worker: str | None = None


class RunReleased(RunReaped):
    reason: str | None = None


class RunFinished(Payload):
    outcome: str | None = None
    detail: str | None = None
    verified: bool | None = None
    iterations: int | None = None
    spent_usd: str | None = None


class WorkspaceRolledBack(RolledBack, ByWhom):
    to: str | None = None  # the rollback point's kind
    kept: list[str] | None = None
    kept_more: int | None = None


class StallRewound(RolledBack, InIteration):
    """A stalled run's workspace taken back to its best iteration's state (or why it was not)."""

    to: int | None = None  # the iteration
    refused: str | None = None


PAYLOADS: dict[str, type[Payload]] = {
    "run.started": RunStarted,
    "run.claimed": RunClaimed,
    "iteration.started": IterationStarted,
    "act.started": ActStarted,
    "act.finished": ActFinished,
    "checks.finished": ChecksFinished,
    "protected.changed": ProtectedChanged,
    "grade.finished": GradeFinished,
    "grade.role": GradeRole,
    "decision.made": DecisionMade,
    "iteration.finished": IterationFinished,
    "run.delegating": RunDelegating,
    "run.delegated": RunDelegated,
    "run.child_started": ChildStarted,
    "run.child_finished": ChildFinished,
    "run.child_waiting": ChildWaiting,
    "run.child_continued": ChildContinued,
    "interjection.queued": InterjectionQueued,
    "run.stop_requested": StopRequested,
    "run.waiting": RunWaiting,
    "run.resumed": RunResumed,
    "attempt.lost": AttemptLost,
    "run.reaped": RunReaped,
    "run.released": RunReleased,
    "run.finished": RunFinished,
    "workspace.rolled_back": WorkspaceRolledBack,
    "stall.rewound": StallRewound,
}


class InvalidEvent(ValueError):
    """A payload its kind's model refuses, or a kind with no model: a writer's mistake, never stored."""


def check(kind: str, data: dict[str, Any]) -> None:
    """Raise `InvalidEvent` unless `data` is a payload of `kind` as its model declares it."""
    model = PAYLOADS.get(kind)
    if model is None:
        raise InvalidEvent(f"no event kind {kind!r}: declare its payload in loops/event_types.py")
    try:
        model.model_validate(data)
    except ValidationError as exc:
        said = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(the payload)'}: {e['msg']}" for e in exc.errors())
        raise InvalidEvent(f"event {kind!r} refused by loops/event_types.py: {said}") from None

