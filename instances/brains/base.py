"""The brain contract: what acts in one iteration.

A brain receives an `ActRequest` and returns a `Reply`. It must return promptly
(within about a second) once `request.stop` is set, reporting the usage it incurred
so far. Provider words never leave a brain module: errors are translated into the
`BrainError` tree below, which the runner maps to outcomes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from budgets import grants
from budgets.grants import Grant
from tether import tracing


@dataclass
class Usage:
    """What an act (or a decider call) consumed. `cost_micros` set means "already priced"."""

    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cost_micros: int | None = None
    calls: int = 0
    # What metered calls of these already cost: reserved before each went out and settled
    # at its usage by the meter (never settled again).
    metered_micros: int = 0

    def add(self, other: Usage) -> Usage:
        cost = None
        if self.cost_micros is not None or other.cost_micros is not None:
            cost = (self.cost_micros or 0) + (other.cost_micros or 0)
        return Usage(
            model=self.model or other.model,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cost_micros=cost,
            calls=self.calls + other.calls,
            metered_micros=self.metered_micros + other.metered_micros,
        )

    def as_json(self) -> dict[str, Any]:
        """Return every field, in declared order (they are all JSON already)."""
        return asdict(self)


@dataclass
class ActRequest:
    run_id: int
    iteration: int
    objective: str
    instruction: str
    workspace: Path
    stop: threading.Event
    timeout: float
    # Earlier iterations in brief, for brains that keep context: {iteration, instruction, response, checks,
    # verdict, and delegated, refused when it did}; an entry that stands for several iterations alike
    # has `times` (how many) and `first` (the first of them), `iteration` being the last.
    snapshot: list[dict[str, Any]] = field(default_factory=list)
    # The same, as text for a model's prompt: compacted within the context budget by the loop
    # (`loops.compaction.for_prompt`); "" when there is none.
    history: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)
    # Tool calls a person approved after the previous act parked the run: run them first.
    approved_calls: list[dict[str, Any]] = field(default_factory=list)
    # Meters every model call the act makes (see `Meter`); None: the calls are not metered.
    meter: Meter | None = None
    # Journals every tool call the act makes (see `Journal`); None: the calls are not journaled.
    journal: Journal | None = None


@dataclass
class Reply:
    ok: bool
    text: str
    usage: Usage = field(default_factory=Usage)
    detail: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    stopped: bool = False
    timed_out: bool = False


class BrainError(Exception):
    """An act that could not happen. Carries the usage spent before it failed."""

    outcome = "provider_error"

    def __init__(
        self, detail: str, usage: Usage | None = None, *, text: str = "", tool_calls: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.usage = usage or Usage()
        # What the act said and called before it ended so: kept in its record (`act.finished`) all the same.
        self.text = text
        self.tool_calls = list(tool_calls or [])


class CredentialError(BrainError):
    """A missing, refused or unfunded credential: retrying fails identically."""

    outcome = "credential_error"


class ProviderError(BrainError):
    """The provider stayed unavailable past the retry bound."""

    outcome = "provider_error"


class BudgetExhausted(BrainError, grants.BudgetExhausted):
    """An act that ended because the run's headroom could not pay for its next model call.

    The meter refuses with `budgets.grants.BudgetExhausted`; this one also carries the act's usage.
    """

    outcome = "budget_exhausted"


class Meter(Protocol):
    """Reserve each model call's worst case before it goes out; settle it at its usage.

    `before` raises `BudgetExhausted` when the headroom cannot pay for a useful call;
    `after` settles the call (also one that failed or was abandoned) and returns its cost.
    """

    def before(self, *, model: str, request_bytes: int, max_tokens: int) -> Grant: ...

    def after(self, grant: Grant, usage: Usage) -> int: ...


@dataclass(frozen=True)
class JournaledCall:
    """A tool call an earlier attempt journaled: finished (with its result) or only started."""

    key: str
    finished: bool
    result: str = ""
    is_error: bool = False


@dataclass
class JournaledTurn:
    """A tool turn an earlier attempt journaled: the model's answer verbatim and its calls by index."""

    turn: int
    content: list[dict[str, Any]] | None
    calls: dict[int, JournaledCall] = field(default_factory=dict)


class JournalError(Exception):
    """The journal could not be written: the call it was to record must not run."""


class Journal(Protocol):
    """Record each tool call before it runs and again with its result, under an idempotency key.

    `replay` returns what earlier attempts of the same iteration journaled, by turn (turn 0:
    the approved calls run before the first model call); `started` commits a call (and, for a
    turn's first call, the model's answer it came in) before the call runs and returns its key;
    `finished` records its result. Both raise `JournalError` when the write failed for good.
    """

    def replay(self) -> dict[int, JournaledTurn]: ...

    def started(
        self, turn: int, index: int, call: dict[str, Any], turn_content: list[dict[str, Any]] | None
    ) -> str: ...

    def finished(self, key: str, result: str, is_error: bool) -> None: ...


class Brain(Protocol):
    def act(self, request: ActRequest) -> Reply: ...

    def unmetered_reserve(self) -> int:
        """Return the micro-dollars one act may spend that no meter sees (its iteration reserves this up front).

        A brain whose every model call goes through a meter answers 0; one whose spend is
        self-reported answers the most it may report before the report ends the run.
        """
        ...


class DelegateRefused(Exception):
    """A `delegate` call refused at once (bounds, arguments, fit, reach); the message is for the model."""


DelegateCheck = Callable[[int, Any, list[dict[str, Any]]], dict[str, Any]]
_delegate_checks: list[DelegateCheck] = []


def on_delegate(check: DelegateCheck) -> None:
    """Register how an act's `delegate` call is vetted (`loops` does, at start: `instances` imports no `loops`)."""
    _delegate_checks[:] = [check]


def check_delegate(run_id: int, arguments: Any, earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """Vet one `delegate` call of run `run_id`'s act, after the act's `earlier` accepted ones.

    Return the input to keep (the children start when the act ends); raise DelegateRefused.
    Without a registered check (no loop in this process) the call is kept as it is, to be vetted
    when its child would start.
    """
    if not _delegate_checks:
        return dict(arguments) if isinstance(arguments, dict) else {}
    return _delegate_checks[0](run_id, arguments, earlier)


def trace_call(
    traced: tracing.Span,
    params: dict[str, Any],
    usage: Usage,
    cost: int,
    body: dict[str, Any] | None,
    *,
    secrets: Sequence[str] = (),
    failed: str = "",
) -> None:
    """Fill a model call's span: the GenAI semantic conventions' usage and response, and what it cost.

    The one owner for every model call Tether makes or meters (the Claude brain's, the gateway's).
    `body` is the Messages API's answer (None when there was none); `secrets` are what the caller's
    texts are kept clear of beyond the server's keys (its key, its MCP servers' secrets). `failed`
    says why the call failed, if it did.
    """
    if traced.span is None:
        return  # tracing is off: nothing to work out
    body = body or {}
    traced.set(
        gen_ai__request__max_tokens=int(params.get("max_tokens") or 0),
        gen_ai__usage__input_tokens=usage.input_tokens,
        gen_ai__usage__output_tokens=usage.output_tokens,
        tether__cost_usd=cost / 1_000_000,
        gen_ai__response__id=body.get("id"),
        gen_ai__response__model=body.get("model"),
        gen_ai__response__finish_reasons=[str(body["stop_reason"])] if body.get("stop_reason") else None,
        gen_ai__input__messages=tracing.content(params.get("messages"), secrets),
        gen_ai__output__messages=tracing.content(body.get("content"), secrets) if body else None,
    )
    if failed:
        traced.error(failed)
