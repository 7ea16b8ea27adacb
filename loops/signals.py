"""What the loop tells the apps above it, so they can listen without the loop importing them.

Sent by `loops.runner` with `sender=Run`:

- `run_starting(run)` — in the worker before the run's first act (iteration 1; again if that
  iteration is retried after a dead worker, so receivers are idempotent), outside any transaction.
- `done_proposed(run, final, checks, stop)` — in the worker when the policy would finish the run
  `done`, outside any transaction. `final` is a `FinalAct`, `checks` the results after its act,
  `stop` the lease's event (abandon model calls when it is set). A receiver that grades returns a
  `GradeReport`; `loops.policy.verdict` turns every report's assessment into the run's verdict.
- `run_finished(run_id)` — after the commit that finished the run or made it wait for a person.
- `iteration_starting(run, number)` — in the worker as an iteration's first attempt begins, before
  its act, outside any transaction (e.g. the workspace a lost attempt's changes are measured from).
- `attempt_lost(run, iteration)` — asked outside any transaction when an attempt of `iteration`
  died: a receiver returns what the workspace changed since the iteration began,
  `{"changed": [{"path", "change"}, ...], "more": n}` or `{"unknown": why}`.
- `rewind_requested(run, token, to, iteration)` — asked in the worker, outside any transaction, when
  the stall handling of iteration `iteration` rewinds (`loops.policy.STALL_REWIND`, the instance's
  `rewind_on_stall`): a receiver restores the workspace to the state iteration `to` left it in, for
  the run driven under lease `token`, and returns `{"rewound": {...what it did}}` or
  `{"refused": why}`. The policy, never the agent, chose `to`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from django.dispatch import Signal

from loops.policy import Assessment

run_starting = Signal()
done_proposed = Signal()
run_finished = Signal()
iteration_starting = Signal()
attempt_lost = Signal()
rewind_requested = Signal()


@dataclass(frozen=True)
class FinalAct:
    """The iteration whose decider proposed done: what the runner knows before recording it."""

    number: int
    response: str
    fingerprint: str = ""


class GradeReport(Protocol):
    """What a `done_proposed` receiver that grades returns."""

    @property
    def assessment(self) -> Assessment: ...

    @property
    def usage(self) -> Any: ...  # an `instances.brains.base.Usage`: the grader's model calls

    def as_event(self, iteration: int) -> tuple[str, dict[str, Any]]: ...
