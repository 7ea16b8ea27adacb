"""What the console shows for runs and events: money, durations, labels, excerpts.

View models only; no queries beyond what the objects they wrap already hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from budgets import pricing
from loops import selectors
from loops.models import Event, Run

EXCERPT_CHARS = 600
INSTRUCTION_CHARS = 400

STATUS_WORDS = {
    Run.Status.QUEUED: "queued",
    Run.Status.RUNNING: "running",
    Run.Status.WAITING: "waiting for you",
    Run.Status.FINISHED: "finished",
}
OUTCOME_TONE = {
    Run.Outcome.DONE: "good",
    Run.Outcome.CANCELLED: "quiet",
    Run.Outcome.ESCALATED: "warn",
}


def usd(micros: int | None) -> str:
    """Return "$1.25", "$0.000125" or "unlimited"."""
    return pricing.format_usd(micros)


def usd_text(value: Any) -> str:
    """Return a dollar amount given as text ("0.001200") as "$0.0012"."""
    try:
        return usd(int(Decimal(str(value)) * 1_000_000))
    except (InvalidOperation, ValueError, TypeError):
        return "—"


def duration(ms: Any) -> str:
    try:
        seconds = int(ms) / 1000
    except (TypeError, ValueError):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def clip(text: Any, limit: int) -> tuple[str, bool]:
    """Return (text cut to `limit` characters, whether it was cut)."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text, False
    return text[:limit].rstrip() + "…", True


class RunView:
    """A run as pages show it: the model's fields plus labels and money as text."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)

    @property
    def spent(self) -> str:
        return usd(self.run.spent_micros)

    @property
    def cap(self) -> str:
        return usd(self.run.max_cost_micros)

    @property
    def status_word(self) -> str:
        if self.run.status == Run.Status.FINISHED:
            return self.run.outcome.replace("_", " ")
        if self.run.cancel_requested_at is not None:
            return "stopping"
        return STATUS_WORDS.get(self.run.status, self.run.status)

    @property
    def tone(self) -> str:
        run = self.run
        if run.status != Run.Status.FINISHED:
            return "warn" if run.status == Run.Status.WAITING else "live"
        if run.outcome == Run.Outcome.DONE and run.verified is False:
            return "warn"
        return OUTCOME_TONE.get(run.outcome, "bad")

    @property
    def objective_excerpt(self) -> str:
        return clip(self.run.objective, 140)[0]

    @property
    def finished(self) -> bool:
        return self.run.status == Run.Status.FINISHED

    @property
    def stoppable(self) -> bool:
        return self.run.status != Run.Status.FINISHED and self.run.cancel_requested_at is None

    @property
    def can_interject(self) -> bool:
        return self.stoppable

    @property
    def iteration_word(self) -> str:
        return f"{self.run.iterations_done} of {self.run.max_iterations}"


@dataclass
class EventView:
    """One event as the timeline draws it."""

    run_id: int
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any]
    iteration: int | None

    @classmethod
    def of(cls, event: Event) -> EventView:
        return cls(
            run_id=event.run_id,
            seq=event.seq,
            kind=event.kind,
            at=event.created_at,
            data=event.data or {},
            iteration=selectors.event_iteration(event),
        )

    @property
    def css(self) -> str:
        return "ev-" + self.kind.replace(".", "-").replace("_", "-")

    @property
    def dom_id(self) -> str:
        return f"run-{self.run_id}-ev-{self.seq}"

    @property
    def known(self) -> bool:
        return self.kind in KNOWN_KINDS

    @property
    def cost(self) -> str:
        return usd_text(self.data.get("cost_usd"))

    @property
    def spent(self) -> str:
        return usd_text(self.data.get("spent_usd"))

    @property
    def duration(self) -> str:
        return duration(self.data.get("duration_ms"))

    @property
    def instruction(self) -> tuple[str, bool]:
        return clip(self.data.get("instruction"), INSTRUCTION_CHARS)

    @property
    def response(self) -> tuple[str, bool]:
        text = str(self.data.get("response") or "")
        if len(text) <= EXCERPT_CHARS:
            return text, False
        return "…" + text[-EXCERPT_CHARS:].lstrip(), True

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        calls = []
        for call in self.data.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            arguments = call.get("input", {})
            calls.append(
                {
                    "name": str(call.get("name", "?")),
                    "input": clip(json.dumps(arguments, ensure_ascii=False, sort_keys=True), 160)[0],
                    "error": bool(call.get("is_error")),
                    "needs_approval": bool(call.get("needs_approval")),
                    "result": clip(call.get("result", ""), 300)[0],
                }
            )
        return calls

    @property
    def usage(self) -> str:
        usage = self.data.get("usage") or {}
        tokens = (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0)
        return f"{tokens:,} tokens" if tokens else ""

    @property
    def checks(self) -> list[dict[str, Any]]:
        return [
            {
                "name": str(c.get("name", "?")),
                "required": bool(c.get("required", True)),
                "passed": bool(c.get("passed")),
                "output": clip(c.get("output", ""), 1000)[0],
            }
            for c in self.data.get("checks") or []
            if isinstance(c, dict)
        ]

    @property
    def checks_summary(self) -> str:
        checks = self.checks
        passed = sum(1 for c in checks if c["passed"])
        return f"{passed} of {len(checks)} passed"

    @property
    def outcome_word(self) -> str:
        return str(self.data.get("outcome") or "?").replace("_", " ")

    @property
    def raw(self) -> str:
        return clip(json.dumps(self.data, ensure_ascii=False, sort_keys=True), 500)[0]


KNOWN_KINDS = frozenset(
    {
        "run.started",
        "run.claimed",
        "iteration.started",
        "act.started",
        "act.finished",
        "checks.finished",
        "decision.made",
        "iteration.finished",
        "interjection.queued",
        "run.stop_requested",
        "run.waiting",
        "run.resumed",
        "run.reaped",
        "run.finished",
    }
)
