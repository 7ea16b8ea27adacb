"""A run's earlier iterations as text for a model's prompt, within a budget.

The loop compacts its memory's snapshot (`loops.memory`) before it hands it to a brain
(`ActRequest.history`) or to the `llm` decider (the snapshot's `history`): recent iterations
nearly verbatim, older ones a line each, the oldest counted, not shown — the text stops
growing however long the run gets. `compact_history` is pure; `for_prompt` gives it the
budget from settings (TETHER_CONTEXT_BUDGET_TOKENS, TETHER_CONTEXT_RECENT).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from instances.brains.text import clip, read_checks

REPEATED_CHARS = 200  # of each field of an entry standing for several iterations alike


def _verdict(item: Mapping[str, Any]) -> str:
    decision = item.get("decision")
    if isinstance(decision, Mapping) and decision.get("verdict"):
        return str(decision["verdict"])
    return str(item.get("verdict") or "")


def _number(item: Mapping[str, Any]) -> int:
    value = item.get("iteration", item.get("number", 0))
    return value if isinstance(value, int) else 0


def _times(item: Mapping[str, Any]) -> int:
    """How many iterations alike the entry stands for (the loop keeps one entry for them)."""
    value = item.get("times", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def _alike_since(item: Mapping[str, Any], number_sign: str = "iteration ") -> str:
    """Return " (and 96 alike since iteration 3)" for an entry standing for several iterations, else ""."""
    times, first = _times(item), item.get("first")
    if times == 1:
        return ""
    start = f", since {number_sign}{first}" if isinstance(first, int) and not isinstance(first, bool) else ""
    return f" (and {times - 1} earlier alike{start})"


def _refused(item: Mapping[str, Any]) -> str:
    refused = item.get("refused")
    return "; ".join(str(r) for r in refused) if isinstance(refused, list | tuple) else ""


def summarise_iteration(item: Mapping[str, Any]) -> str:
    """Return one line for an older iteration: verdict, check tally, instruction gist."""
    checks = read_checks(item.get("checks"))
    verdict = _verdict(item)
    parts = [f"#{_number(item)}{_alike_since(item, '#')} {verdict}".rstrip()]
    if item.get("act_ok") is False:
        parts.append("act failed")
    if checks:
        passed = sum(1 for _, ok, _ in checks if ok)
        failing = [name for name, ok, _ in checks if ok is False]
        tally = f"checks {passed}/{len(checks)}"
        parts.append(tally + (f" (failing: {', '.join(failing[:4])})" if failing else ""))
    if delegated := str(item.get("delegated") or ""):
        parts.append(f"delegated {clip(delegated, 100)}")
    if refused := _refused(item):
        parts.append(f"refused: {clip(refused, 100)}")
    instruction = " ".join(str(item.get("instruction") or "").split())
    parts.append(f"did: {clip(instruction, 100)}")
    return "- " + "; ".join(parts)


def render_iteration(item: Mapping[str, Any], limit: int) -> str:
    """Return an iteration nearly verbatim, each field clipped so the whole fits `limit` chars.

    An entry standing for several iterations alike says how many, and its fields are clipped to
    `REPEATED_CHARS`: the model is told that it went so again, not all of it again.
    """
    field_limit = max(limit // 3, 80) if _times(item) == 1 else REPEATED_CHARS
    lines = [f"Iteration {_number(item)}{_alike_since(item)}:"]
    if instruction := str(item.get("instruction") or ""):
        lines.append(f"  instruction: {clip(instruction, field_limit)}")
    response = str(item.get("response") or item.get("text") or "")
    if response:
        lines.append(f"  agent answered: {clip(response, field_limit)}")
    if delegated := str(item.get("delegated") or ""):
        lines.append(f"  delegated {clip(delegated, field_limit)}")
    if refused := _refused(item):
        lines.append(f"  refused: {clip(refused, field_limit)}")
    if item.get("act_ok") is False or item.get("act_detail"):
        lines.append(f"  act: {'ok' if item.get('act_ok') else 'failed'} {clip(str(item.get('act_detail') or ''), 200)}")
    for name, ok, output in read_checks(item.get("checks")):
        state = "passed" if ok else "FAILED" if ok is False else "?"
        lines.append(f"  check {name}: {state}" + (f" — {clip(output, 300)}" if output and not ok else ""))
    decision = item.get("decision")
    reason = decision.get("reason", "") if isinstance(decision, Mapping) else ""
    # An earlier iteration went on, as a rule: its verdict is said when it is news.
    if (verdict := _verdict(item)) and (verdict != "continue" or reason):
        lines.append(f"  verdict: {verdict}" + (f" — {clip(str(reason), 200)}" if reason else ""))
    return clip("\n".join(lines), limit)


def compact_history(items: Iterable[Mapping[str, Any]], *, budget_tokens: int, recent: int = 3) -> str:
    """Return earlier iterations as text within `budget_tokens`: recent ones verbatim, older summarised.

    Pure. Older summaries are kept newest first until the budget runs out; the rest are
    counted, not shown, so the text stops growing however long the run gets. An entry that
    stands for several iterations alike is shown once, with how many and since when: the
    history of a loop that repeats itself stays the size it had when it first repeated.
    """
    ordered = sorted((i for i in items if isinstance(i, Mapping)), key=_number)
    if not ordered:
        return ""
    budget = max(budget_tokens, 200) * 4
    latest = ordered[-recent:] if recent > 0 else []
    older = ordered[: len(ordered) - len(latest)]
    share = (budget * 2 // 3) // max(len(latest), 1)
    verbatim = [render_iteration(item, share) for item in latest]
    room = budget - sum(len(v) + 1 for v in verbatim) - 120
    lines: list[str] = []
    for item in reversed(older):
        line = summarise_iteration(item)
        if len(line) + 1 > room:
            break
        lines.append(line)
        room -= len(line) + 1
    total = sum(map(_times, ordered))  # said when not all of them are shown in full
    heading = f"History of this run ({total} earlier iterations; recent ones in full):" if older else ""
    parts = [heading or "History of this run:"]
    if omitted := sum(map(_times, older[: len(older) - len(lines)])):
        parts.append(f"- ({omitted} older iteration(s) not shown)")
    parts += reversed(lines)
    parts += verbatim
    return "\n".join(parts)


def for_prompt(items: Iterable[Mapping[str, Any]]) -> str:
    """Return `items` compacted as a Claude act's (and the `llm` decider's) prompt shows them.

    Within TETHER_CONTEXT_BUDGET_TOKENS, the last TETHER_CONTEXT_RECENT nearly whole (read on every
    call, so tests can override them).
    """
    return compact_history(
        items, budget_tokens=int(settings.TETHER_CONTEXT_BUDGET_TOKENS), recent=int(settings.TETHER_CONTEXT_RECENT)
    )
