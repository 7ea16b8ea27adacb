"""The brain contract: what acts in one iteration.

A brain receives an `ActRequest` and returns a `Reply`. It must return promptly
(within about a second) once `request.stop` is set, reporting the usage it incurred
so far. Provider words never leave a brain module: errors are translated into the
`BrainError` tree below, which the runner maps to outcomes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


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
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cost_micros": self.cost_micros,
            "calls": self.calls,
        }


@dataclass
class ActRequest:
    run_id: int
    iteration: int
    objective: str
    instruction: str
    workspace: Path
    stop: threading.Event
    timeout: float
    # Compact history of earlier iterations, for brains that keep context.
    snapshot: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    # Tool calls a person approved after the previous act parked the run: run them first.
    approved_calls: list[dict[str, Any]] = field(default_factory=list)


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

    def __init__(self, detail: str, usage: Usage | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.usage = usage or Usage()


class CredentialError(BrainError):
    """A missing, refused or unfunded credential: retrying fails identically."""

    outcome = "credential_error"


class ProviderError(BrainError):
    """The provider stayed unavailable past the retry bound."""

    outcome = "provider_error"


class Brain(Protocol):
    def act(self, request: ActRequest) -> Reply: ...
