"""What the console shows for runs and events: money, durations, labels, excerpts.

View models only; no queries beyond what the objects they wrap already hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from budgets import money
from loops import continuation, event_kinds, outcomes, selectors
from loops.models import Event, Run
from web.console.forms import ContinueRunForm

EXCERPT_CHARS = 600
INSTRUCTION_CHARS = 400

STATUS_WORDS = {
    Run.Status.QUEUED: "queued",
    Run.Status.RUNNING: "running",
    Run.Status.WAITING: "waiting for you",
    Run.Status.FINISHED: "finished",
}
OUTCOME_TONE = outcomes.TONES


def usd(micros: int | None) -> str:
    """Return "$1.25", "$0.000125" or "unlimited"."""
    return money.format_usd(micros)


def usd_text(value: Any) -> str:
    """Return a dollar amount given as text ("0.001200") as "$0.0012"."""
    try:
        return usd(money.usd_to_micros(value, allow_negative=True))
    except ValueError:
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
        self.nested: list[RunView] = []  # on the fleet: its children at work, drawn under it

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
        if self.waiting_on_children:
            return self.children_word
        return STATUS_WORDS.get(self.run.status, self.run.status)

    @property
    def tone(self) -> str:
        run = self.run
        if run.status != Run.Status.FINISHED:
            return "warn" if self.awaits_person else "live"
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
    def awaits_person(self) -> bool:
        """Whether the run waits for a person's answer (not for the children it delegated to)."""
        return self.run.status == Run.Status.WAITING and not self.waiting_on_children

    @cached_property
    def live_children(self) -> list[int]:
        """Return the ids of this run's children that have not finished (a stop stops them too).

        Only a run waiting for its children has any (it goes on once they all finished): one query then.
        """
        if not self.waiting_on_children:
            return []
        return list(
            Run.objects.filter(parent_id=self.run.pk).exclude(status=Run.Status.FINISHED).order_by("pk")
            .values_list("pk", flat=True)
        )

    @property
    def continued_as(self) -> Run | None:
        """Return the run that continues this one, if any (one query)."""
        return getattr(self.run, "continuation", None)

    @property
    def can_continue(self) -> bool:
        """Whether a person may continue this run as a new one (see loops.continuation)."""

        run = self.run
        why = continuation.refusal(
            run_id=run.pk, status=run.status, outcome=run.outcome, verified=run.verified,
            next_iteration=run.next_iteration, max_iterations=run.max_iterations,
        )
        return not why and self.continued_as is None

    @property
    def continue_form(self) -> Any:
        """Return a fresh "continue this run" form (pages with a bound one pass their own)."""

        return ContinueRunForm(run=self.run)

    @property
    def iteration_number(self) -> int:
        """Return the iteration a person is told about: the one in progress, else the last finished."""
        run = self.run
        if run.status == Run.Status.RUNNING:
            return min(run.next_iteration, run.max_iterations)
        return run.iterations_done

    @property
    def iteration_word(self) -> str:
        """Return "iteration 3 of 12" (said this way on every page), or "no iteration yet, up to 12"."""
        number = self.iteration_number
        if not number:
            return f"no iteration yet, up to {self.run.max_iterations}"
        return f"iteration {number} of {self.run.max_iterations}"

    @property
    def live(self) -> bool:
        """Whether the run can still change (it has not finished)."""
        return self.run.status != Run.Status.FINISHED

    @property
    def actions_key(self) -> str:
        """Return what decides which actions the run page offers; a live update redraws them when it changes."""
        later = self.continued_as
        return "|".join(
            str(part)
            for part in (
                self.run.status, self.run.cancel_requested_at is not None, self.run.outcome,
                self.waiting_on_children, self.can_continue, later.pk if later else "",
            )
        )

    @cached_property
    def stopped_by(self) -> str:
        """Return who asked the run to stop ("" if nobody did)."""
        if self.run.cancel_requested_at is None:
            return ""
        return stopped_by(self.run.pk)

    @property
    def stopped(self) -> bool:
        return self.finished and self.run.outcome == Run.Outcome.CANCELLED

    @property
    def outcome_headline(self) -> str:
        """Return the summary's one-line verdict: "Stopped by ada", "Done", "Max iterations"…"""
        if self.stopped:
            return f"Stopped by {self.stopped_by}" if self.stopped_by else "Stopped"
        return self.status_word[:1].upper() + self.status_word[1:]

    @property
    def outcome_text(self) -> str:
        """Return the outcome's detail, naming the person who stopped the run."""
        detail = self.run.outcome_detail or ""
        if self.stopped and self.stopped_by:
            detail = detail.replace("stopped by a person", "").replace(f"stopped by {self.stopped_by}", "").strip()
            return (detail[:1].upper() + detail[1:] + ".") if detail else ""
        return detail

    @property
    def waiting_on_children(self) -> bool:
        """Whether the run waits for the child runs it delegated to (not for a person)."""
        return self.run.waiting_for_children

    @property
    def children_waited(self) -> int:
        """Return how many children the run waits for: those its act started (or asked for, while starting)."""
        state = self.run.delegation or {}
        return len(state.get("children") or []) or len(state.get("calls") or [])

    @property
    def children_word(self) -> str:
        """Return "waiting for 2 children" (a waiting parent's status on every page)."""
        n = self.children_waited
        if not n:
            return "waiting for its children"
        return f"waiting for {n} child" if n == 1 else f"waiting for {n} children"

    @property
    def worker_note(self) -> WorkerNote | None:
        """Return what a run that waits on a worker should say, or None while a worker is driving it."""
        return worker_note(self.run)


@dataclass
class TreeView:
    """A delegation tree as the run page draws it."""

    tree: selectors.Tree
    run: Run | None = None

    @property
    def workspace(self) -> str:
        """Return the workspace mode this run was delegated with ("" for a root).

        Read from the parent (a child that delegated in turn keeps its own state in its `delegation`).
        """
        if self.run is None or self.tree.parent is None:
            return ""
        asked = ((self.tree.parent.delegation or {}).get("placed") or {}).get(str(self.run.pk))
        return str((asked or self.run.delegation or {}).get("workspace") or "")

    @property
    def root(self) -> RunView:
        return RunView(self.tree.root)

    @property
    def parent(self) -> RunView | None:
        return RunView(self.tree.parent) if self.tree.parent else None

    @property
    def children(self) -> list[RunView]:
        return [RunView(child) for child in self.tree.children]

    @property
    def runs(self) -> int:
        return self.tree.runs

    @property
    def spent(self) -> str:
        return usd(self.tree.spent_micros)

    @property
    def cap(self) -> str:
        return usd(self.tree.root.max_cost_micros)

    @property
    def used_percent(self) -> int:
        cap = self.tree.root.max_cost_micros
        return min(100, max(0, round(100 * self.tree.spent_micros / cap))) if cap else 0

    @property
    def needing_you(self) -> list[RunView]:
        """Return the children waiting for a person (not for their own children)."""
        return [c for c in self.children if c.status == Run.Status.WAITING and not c.waiting_on_children]


def tree_view(run: Run) -> TreeView | None:
    found = selectors.run_tree(run)
    return TreeView(found, run) if found else None


@dataclass
class WorkerNote:
    """A live run with no worker driving it (or none heard from lately): what to say, and a countdown."""

    text: str
    expires_at: datetime | None  # the lease's expiry, for "lease expires in N s" (None: expired)
    seconds: int


def worker_note(run: Run, now: datetime | None = None) -> WorkerNote | None:
    """Say so when a queued run waits for a worker, or a running one's worker stopped renewing its lease.

    A live worker renews its leases every third of TETHER_LEASE_SECONDS; a lease with less
    than a third left (give or take a second) was not renewed on time: its worker is likely gone.
    """

    now = now or timezone.now()
    expires = run.lease_expires_at
    if run.status not in (Run.Status.QUEUED, Run.Status.RUNNING) or expires is None:
        return None
    left = (expires - now).total_seconds()
    lease = float(settings.TETHER_LEASE_SECONDS)
    if run.status == Run.Status.RUNNING and run.lease_token and left > lease / 3 - 1:
        return None  # renewed on time: a worker is driving it
    if left <= 0:
        return WorkerNote("waiting for a worker to pick it up (its lease has expired; the reaper hands it on)", None, 0)
    seconds = int(left + 0.999)
    if run.status == Run.Status.RUNNING:
        return WorkerNote("its worker has gone quiet: waiting for a worker to pick it up", expires, seconds)
    return WorkerNote("waiting for a worker to pick it up", expires, seconds)


@dataclass
class EventView:
    """One event as the timeline draws it: its title and body come from loops.event_kinds."""

    run_id: int
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any]
    iteration: int | None
    stopped_by: str | None = None  # who stopped the run; looked up when a title needs it

    @classmethod
    def of(cls, event: Event, stopped_by: str | None = None) -> EventView:
        return cls(
            run_id=event.run_id,
            seq=event.seq,
            kind=event.kind,
            at=event.created_at,
            data=event.data or {},
            iteration=selectors.event_iteration(event),
            stopped_by=stopped_by,
        )

    @property
    def css(self) -> str:
        return "ev-" + self.kind.replace(".", "-").replace("_", "-")

    @property
    def dom_id(self) -> str:
        return f"run-{self.run_id}-ev-{self.seq}"

    @property
    def entry(self) -> event_kinds.Kind:
        return event_kinds.kind(self.kind)

    @property
    def known(self) -> bool:
        return self.kind in event_kinds.KINDS

    @property
    def body(self) -> str:
        return self.entry.body

    @property
    def secondary(self) -> bool:
        return self.entry.secondary

    @cached_property
    def title(self) -> event_kinds.Title:
        context = event_kinds.Context()
        if event_kinds.needs_stopper(self.kind, self.data):
            if self.stopped_by is None:
                self.stopped_by = stopped_by(self.run_id)
            context = event_kinds.Context(stopped_by=self.stopped_by)
        return self.entry.describe(self.data, context)

    @property
    def title_links(self) -> list[tuple[str, int, str]]:
        """Return (words before the link, run id, url) for each run the title names."""
        return [(prefix, run_id, reverse("loops:run-detail", args=[run_id])) for prefix, run_id in self.title.links]

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
    def attempt_label(self) -> str:
        """Return "attempt 2 of iteration 3" for an iteration started again after its worker died, else ""."""
        if self.kind != "iteration.started":
            return ""
        return event_kinds.attempt_label(self.data)

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
                    "key": str(call.get("key") or ""),  # the journal's idempotency key
                    "replayed": str(call.get("replayed") or ""),  # "result" or "interrupted": from the journal
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


def stopped_by(run_id: int) -> str:
    """Return the name of who first asked run `run_id` to stop ("" if nobody did; one query)."""
    data = (
        Event.objects.filter(run_id=run_id, kind="run.stop_requested")
        .order_by("seq")
        .values_list("data", flat=True)
        .first()
    )
    return str((data or {}).get("by") or "")
