"""What the loop tells the apps above it, so they can listen without the loop importing them.

A proposed done is not a signal: its graders register with `loops.grading`, which calls them in
a declared order.

Sent by `loops.runner` with `sender=Run`:

- `run_starting(run)` — in the worker before the run's first act (iteration 1; again if that
  iteration is retried after a dead worker, so receivers are idempotent), outside any transaction.
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

from typing import Any

from django.dispatch import Signal

run_starting = Signal()
run_finished = Signal()
iteration_starting = Signal()
attempt_lost = Signal()
rewind_requested = Signal()



def ask_rewind(run: Any, token: str, to: int, iteration: int) -> tuple[str, tuple[str, dict[str, Any]]]:
    """Have the workspace go back to the state iteration `to` left it in (a stall's rewind): (why not, its event).

    The rollback's owner does it, as the receiver of `rewind_requested`, under the driver's lease `token`.
    """
    data: dict[str, Any] = {"iteration": iteration, "to": to}
    sent = rewind_requested.send(sender=type(run), run=run, token=token, to=to, iteration=iteration)
    answer = next((dict(a) for _, a in sent if a is not None), {"refused": "no snapshots of the workspace are kept"})
    if "rewound" not in answer:
        refused = str(answer.get("refused") or "it was refused")[:500]
        return refused, ("stall.rewound", {**data, "refused": refused})
    return "", ("stall.rewound", {**data, **dict(answer["rewound"])})
