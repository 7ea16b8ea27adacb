"""The graders of a proposed done: an explicit registry the engine owns, called in a declared order.

When the policy would finish a run `done`, the runner asks every registered grader, in the worker,
outside any transaction, in ascending `order` (ties are refused), and feeds each report's
`assessment` to `loops.policy.verdict` in that same order: the first grader to send the agent back
wins, the first to fail the run names why, and the evidence of those that vouch is listed in order.
The apps register their graders in `AppConfig.ready` (the engine does not import them):

1. `ROLE` — `loops.delegation.role_check`: a composition's done is verified only with its verifying
   role's pass (registered by `loops.receivers`).
2. `CONFIGURED` — `reviews.graders.on_done_proposed`: the instance's configured graders (the
   response check, the changed-nothing check, the tamper scan and the LLM judge), registered by
   `reviews.apps`.

A grader is called as `grader(run=..., final=..., checks=..., stop=..., meter=...)`: `final` is a
`FinalAct`, `checks` the results after its act, `stop` the lease's event (abandon model calls when
it is set), `meter` the run's metering. It returns a `GradeReport`, or None when it has nothing to
say of this run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loops.policy import Assessment

ROLE = 100  # a composition's verifying role, before anything that may spend on a judge
CONFIGURED = 200  # the instance's configured graders and judge


@dataclass(frozen=True)
class FinalAct:
    """The iteration whose decider proposed done: what the runner knows before recording it."""

    number: int
    response: str
    fingerprint: str = ""


class GradeReport(Protocol):
    """What a grader returns."""

    @property
    def assessment(self) -> Assessment: ...

    @property
    def usage(self) -> Any: ...  # an `instances.brains.base.Usage`: the grader's model calls

    def as_event(self, iteration: int) -> tuple[str, dict[str, Any]]: ...


Grader = Callable[..., GradeReport | None]


class AlreadyRegistered(ValueError):
    """A grader's name or order is taken: two graders never share either."""


@dataclass(frozen=True)
class Entry:
    name: str
    grader: Grader
    order: int


class Registry:
    """Graders by name, each with its own order; `graders()` lists them in that order."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, grader: Grader, *, order: int) -> None:
        """Add `grader` as `name` at `order`; refuse a name or an order already taken."""
        if name in self._entries:
            raise AlreadyRegistered(f"a grader named {name!r} is already registered")
        taken = next((e.name for e in self._entries.values() if e.order == order), None)
        if taken is not None:
            raise AlreadyRegistered(f"order {order} is already {taken!r}'s: give {name!r} its own")
        self._entries[name] = Entry(name, grader, order)

    def graders(self) -> list[Entry]:
        return sorted(self._entries.values(), key=lambda entry: entry.order)

    def grade(self, *, run: Any, final: FinalAct, checks: Any, stop: Any = None, meter: Any = None) -> list[GradeReport]:
        """Ask every grader, in order, of the done `final` proposes; return the reports they made."""
        reports = []
        for entry in self.graders():
            report = entry.grader(run=run, final=final, checks=checks, stop=stop, meter=meter)
            if report is not None:
                reports.append(report)
        return reports


REGISTRY = Registry()
register = REGISTRY.register
graders = REGISTRY.graders
grade = REGISTRY.grade
