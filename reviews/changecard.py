"""The change card: what a run changed, at a glance.

Every finished (or waiting) run, and so every review item, has one: the files added, changed
and removed with their line counts; the tests added, removed or edited (by path, and by test
name where the file says them); the protected paths an act touched (`instances.protected`, as
the runner recorded them on the run); the checks over the iterations (passed or failed per
check, and the failing tests' count where the check's test report gave it: "failing tests
7 → 3 → 0"); cost and iterations; and the agent's own account of its work, marked as its claim.

It is computed from what is stored — the run's start and end trees (`reviews.snapshots`), the
iterations' check results and the run's fields — never by running anything again. `card(...)`
is pure (plain data in, JSON-able data out); `for_run(run)` loads the data and redacts the card
(`tether.redaction`). The run page, the review item, the receipt (signed with the rest), the
REST API and MCP all show this one card.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from budgets import money
from instances import protected
from reviews import snapshots
from tether.redaction import redact_data

log = logging.getLogger(__name__)

VERSION = 1
LISTED = 200  # files (and tests) a card names per kind; the rest are counted
SHOWN_STEPS = 12  # iterations a trajectory line names; a longer one shows its start and end
ACCOUNT_MAX_CHARS = 800
TRAJECTORY_MAX = 100  # iterations a card keeps per check
# What is a test file: tests/ or test/ anywhere, pytest's file names (`instances.protected.matches`).
TEST_GLOBS = ("tests/", "test/", "test_*.py", "*_test.py")
STATUSES = ("added", "changed", "removed")


def is_test_file(path: str) -> bool:
    return protected.matches(path, TEST_GLOBS)


def test_names(path: str, source: bytes | None) -> dict[str, str]:
    """Return {pytest node id: a digest of its code} of the tests a Python file defines. Pure.

    Module-level `test*` functions, and `test*` methods of `Test*` classes, as pytest collects
    them; a file that is not Python, or does not parse, defines none that can be named.
    """
    if source is None or not path.endswith(".py"):
        return {}
    try:
        return _test_names(path, ast.parse(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested too deep to parse or dump
        return {}


def _test_names(path: str, tree: ast.Module) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            found[f"{path}::{node.name}"] = ast.dump(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and inner.name.startswith(
                    "test"
                ):
                    found[f"{path}::{node.name}::{inner.name}"] = ast.dump(inner)
    return found


def _listed(items: Sequence[Any]) -> tuple[list[Any], int]:
    return list(items[:LISTED]), max(len(items) - LISTED, 0)


def _steps(values: Sequence[str]) -> str:
    if len(values) > SHOWN_STEPS:
        values = [*values[: SHOWN_STEPS // 2], "…", *values[-(SHOWN_STEPS // 2) :]]
    return " → ".join(values)


def trajectory(iterations: Iterable[tuple[int, Sequence[Mapping[str, Any]]]]) -> dict[str, Any]:
    """Each check over the iterations: `{"checks": [{name, steps: [{iteration, passed, failing}],
    failing_at_end}], "lines": ["tests: failing tests 7 → 3 → 0"]}`. `failing` is the failing tests'
    count where the check's test report gave it, else None; `failing_at_end` the failing tests the
    report of its last run names. Pure."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    failing_at_end: dict[str, list[str]] = {}
    for number, checks in iterations:
        for check in checks:
            tests = check.get("tests") if isinstance(check.get("tests"), dict) else None
            failing_at_end[str(check.get("name"))] = [str(n) for n in (tests or {}).get("failed_names") or []]
            by_name.setdefault(str(check.get("name")), []).append(
                {
                    "iteration": number,
                    "passed": bool(check.get("passed")),
                    "failing": int(tests["failed"])
                    if tests and isinstance(tests.get("failed"), int)
                    else None,
                }
            )
    lines = []
    for name, steps in by_name.items():
        if all(step["failing"] is not None for step in steps):
            lines.append(f"{name}: failing tests {_steps([str(step['failing']) for step in steps])}")
        else:
            lines.append(f"{name}: {_steps(['passed' if step['passed'] else 'failed' for step in steps])}")
    return {
        "checks": [
            {"name": name, "steps": steps[-TRAJECTORY_MAX:], "failing_at_end": failing_at_end.get(name, [])}
            for name, steps in by_name.items()
        ],
        "lines": lines,
    }


def account(response: str) -> str:
    """The agent's own account of its work: the first paragraph of its last answer, bounded. Pure."""
    text = response.strip().replace("\r\n", "\n")
    paragraph = text.split("\n\n", 1)[0].strip()
    if len(paragraph) > ACCOUNT_MAX_CHARS:
        paragraph = paragraph[:ACCOUNT_MAX_CHARS].rstrip() + "…"
    return paragraph


def card(
    *,
    deltas: Sequence[snapshots.FileDelta],
    more_files: int = 0,
    note: str = "",
    protected_changed: Sequence[str] = (),
    iterations: Sequence[tuple[int, Sequence[Mapping[str, Any]]]] = (),
    cost_micros: int = 0,
    iterations_done: int = 0,
    response: str = "",
) -> dict[str, Any]:
    """Return the change card of a run from its stored data (see the module's docstring). Pure."""
    files: dict[str, Any] = {}
    for status in STATUSES:
        rows = [
            {
                "path": d.path,
                "lines_added": d.lines_added,
                "lines_removed": d.lines_removed,
                "binary": d.binary,
            }
            for d in sorted(deltas, key=lambda d: d.path)
            if d.status == status
        ]
        files[status], files[f"{status}_more"] = _listed(rows)
    files["lines_added"] = sum(d.lines_added for d in deltas)
    files["lines_removed"] = sum(d.lines_removed for d in deltas)
    files["count"] = len(deltas) + more_files
    files["note"] = note

    tests: dict[str, list[str]] = {"added": [], "removed": [], "edited": []}
    names: dict[str, list[str]] = {"added": [], "removed": [], "edited": []}
    for d in sorted(deltas, key=lambda d: d.path):
        if not is_test_file(d.path):
            continue
        tests[{"added": "added", "removed": "removed"}.get(d.status, "edited")].append(d.path)
        before, after = test_names(d.path, d.before), test_names(d.path, d.after)
        names["added"] += [n for n in after if n not in before]
        names["removed"] += [n for n in before if n not in after]
        names["edited"] += [n for n in after if n in before and after[n] != before[n]]
    test_card: dict[str, Any] = {}
    for kind in ("added", "removed", "edited"):
        test_card[kind], test_card[f"{kind}_more"] = _listed(tests[kind])
        test_card[f"names_{kind}"], test_card[f"names_{kind}_more"] = _listed(names[kind])

    return {
        "version": VERSION,
        "files": files,
        "tests": test_card,
        "protected_touched": sorted(str(p) for p in protected_changed),
        "checks": trajectory(iterations),
        "iterations": iterations_done,
        "cost_usd": money.usd_string(cost_micros),
        "agent_claim": {"text": account(response), "note": "the agent's own account, not verified by Tether"},
    }


def for_run(run: Any) -> dict[str, Any] | None:
    """Return the run's change card, redacted; None while the run is live (it has no end yet)."""
    if run.status not in ("finished", "waiting"):
        return None
    deltas, more, note = snapshots.file_deltas(run, read=is_test_file)
    rows = list(run.iterations.order_by("number").values_list("number", "checks", "response"))
    rest: dict[str, Any] = {
        "protected_changed": list(run.protected_changed or []),
        "iterations": [(number, checks or []) for number, checks, _ in rows],
        "cost_micros": run.spent_micros,
        "iterations_done": run.iterations_done,
        "response": rows[-1][2] if rows else "",
    }
    try:
        computed = card(deltas=deltas, more_files=more, note=note, **rest)
    except Exception:  # the files are the agent's: whatever they hold, the run still has a card
        log.warning("change card of run %s: its files could not be read", run.pk, exc_info=True)
        unread = f"the {len(deltas) + more} changed files could not be read for this card"
        computed = card(deltas=[], more_files=len(deltas) + more, note=unread, **rest)
    return redact_data(computed)
