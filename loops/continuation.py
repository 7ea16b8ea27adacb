"""Continuing a finished run: which runs may be continued, and what the new run carries.

Pure: no Django, no clock, no I/O. `refusal` says why a run may not be continued (or "" when it
may): every finished run may (`CONTINUABLE`: whatever way it ended), except one out of budget,
which is resumed in place instead; a run still going or waiting for a person may not. A verified
`done` is continued as a follow-up (`follows_up`): the person's message is the new run's
objective. `carried_history` is the memory the new run starts with: the old run's rolling snapshot,
renumbered so that its iterations come before the new run's (the old run's last iteration is 0,
the one before it -1, …; each entry keeps the run and iteration it came from), and none of the
old run's no-progress bookkeeping or pending approvals — the new run is judged on its own
iterations. `first_instruction` is what the new run's first iteration is told: how the old run
ended, what it did, and its last instruction. A person's message is not folded in here: it is
queued as a message for the first iteration, which the runner folds in as it folds any message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loops.memory import Memory
from loops.outcomes import CONTINUABLE, Outcome

# How much of the old run the first instruction repeats: its last iterations, each clipped.
SHOWN_ITERATIONS = 8
FIELD_CHARS = 300
LAST_INSTRUCTION_CHARS = 2000  # of the old run's last instruction


def refusal(*, run_id: int, status: str, outcome: str, verified: bool | None, next_iteration: int,
            max_iterations: int) -> str:
    """Return why run `run_id` cannot be continued, or "" when it can."""
    if status == "waiting":
        return (
            f"run {run_id} is waiting for a person: answer it (POST …/interject with a message) or close it; "
            "only a finished run can be continued"
        )
    if status != "finished":
        return (
            f"run {run_id} is still {status}: send it a message (POST …/interject) or stop it first; "
            "only a finished run can be continued"
        )
    if outcome == Outcome.BUDGET_EXHAUSTED:
        hint = (
            f"use resume (POST …/resume, optionally with a higher max_cost_usd): it goes on from iteration "
            f"{next_iteration}" if next_iteration <= max_iterations else "use resume (POST …/resume)"
        )
        return f"run {run_id} ran out of budget; {hint} instead of continuing it as a new run"
    if outcome not in CONTINUABLE:
        return f"run {run_id} ended {outcome or 'without an outcome'}, which cannot be continued; start a new run instead"
    return ""


def follows_up(*, outcome: str, verified: bool | None) -> bool:
    """Whether continuing a run so ended is a follow-up: new work, the person's message its objective."""
    return outcome == "done" and bool(verified)


def carried_history(history: Mapping[str, Any] | None, *, run_id: int, iterations_done: int) -> dict[str, Any]:
    """Return the new run's starting `history`: the old run's snapshot, numbered before the new run's."""
    carried = []
    for item in Memory.of(history).snapshot:
        number = item.get("iteration")
        number = number if isinstance(number, int) and not isinstance(number, bool) else 0
        entry = dict(item)
        entry.setdefault("from_run", run_id)
        entry.setdefault("from_iteration", number)
        entry["iteration"] = number - iterations_done
        first = item.get("first")  # an entry standing for several iterations alike: the first of them
        if isinstance(first, int) and not isinstance(first, bool):
            entry["first"] = first - iterations_done
        carried.append(entry)
    return Memory(snapshot=tuple(carried)).as_json()


def _clip(value: Any, limit: int = FIELD_CHARS) -> str:
    text = " ".join(str(value or "").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _line(item: Mapping[str, Any]) -> str:
    parts = [f"- run {item.get('from_run')}, iteration {item.get('from_iteration')}{_alike_since(item)}:"]
    if verdict := item.get("verdict"):
        parts.append(f"verdict {verdict};")
    checks = item.get("checks")
    if isinstance(checks, Mapping) and checks:
        shown = ", ".join(f"{name} {'passed' if ok else 'FAILED'}" for name, ok in list(checks.items())[:8])
        parts.append(f"checks: {shown};")
    if instruction := _clip(item.get("instruction")):
        parts.append(f"told: {instruction}")
    if response := _clip(item.get("response")):
        parts.append(f"— it answered: {response}")
    if delegated := _clip(item.get("delegated"), 150):
        parts.append(f"— it delegated {delegated}")
    if isinstance(refused := item.get("refused"), list) and refused:
        parts.append(f"— refused: {_clip('; '.join(map(str, refused)), 150)}")
    return " ".join(parts)


def _alike_since(item: Mapping[str, Any]) -> str:
    """Say how many iterations went as this entry's did, for one that stands for several (`Memory.joined`)."""
    values = [item.get(name) for name in ("times", "iteration", "first", "from_iteration")]
    numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(numbers) < 4 or numbers[0] < 2:
        return ""
    times, number, first, since = numbers
    return f" (and {times - 1} earlier alike, since iteration {since - (number - first)})"


def first_instruction(
    *,
    run_id: int,
    outcome: str,
    detail: str,
    carried: Sequence[Mapping[str, Any]],
    last_instruction: str,
    follow_up: str = "",
) -> str:
    """Return the new run's first instruction: how run `run_id` ended, what it did, what it was told last.

    `follow_up`: the new objective, when run `run_id` ended done and verified (`follows_up`); the
    instruction then ends with it.
    """
    if follow_up:
        ended = "done, and verified"
    elif outcome == "done":
        ended = "done, but not verified"
    else:
        ended = outcome.replace("_", " ")
    lines = [
        f"This run {'follows up on' if follow_up else 'continues'} run {run_id}, which ended {ended}"
        + (f": {_clip(detail, 1000)}" if detail else "."),
        f"The workspace is as run {run_id} left it; build on what is there rather than starting over.",
    ]
    shown = list(carried)[-SHOWN_ITERATIONS:]
    if shown:
        earlier = len(carried) - len(shown)
        lines += ["", f"What it did (its last {len(shown)} iteration{'s' if len(shown) != 1 else ''}, oldest first"
                  + (f"; {earlier} earlier not shown" if earlier else "") + "):"]
        lines += [_line(item) for item in shown]
    if last := last_instruction.strip():
        # Clipped: a continuation of a continuation would otherwise carry every first instruction before it.
        if len(last) > LAST_INSTRUCTION_CHARS:
            last = last[: LAST_INSTRUCTION_CHARS - 1].rstrip() + "…"
        lines += ["", f"The last instruction run {run_id} was given:", last]
    if follow_up:
        lines += ["", "Its work is done. What to do now (the objective of this run):", follow_up]
    return "\n".join(lines)
