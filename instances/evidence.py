"""What a check's evidence is worth: a test report from outside the workspace, or its exit code only.

A check runs with Tether's pytest plugin (`instances/evidence_plugin/`) on a read-only path, and with a
directory of its own, outside the workspace, where the plugin writes one report per test session.
`judge` reads those reports against the run's baseline -- the tests pytest collected before the
agent's first act (`collect_baseline`) -- and says whether the check's tests ran as written:

- a report exists and is complete (an `os._exit(0)` or a crash before the session ends leaves none);
- it is not a `--collect-only` session, and every test it collected ran;
- no more tests were deselected than at the baseline;
- every test present at the baseline ran and passed (an expected failure, `xfail`, counts as run).

A check that is not pytest and writes no report is "exit code only": its exit status is all
there is, and the verdict, the receipt and the run page say so. A check spec may require a
report (`"evidence": "report"`); without one it then fails.

Pure, except `reports` (reads the report directory) and `collect_baseline` (runs a collection).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLUGIN_DIR = Path(__file__).resolve().parent / "evidence_plugin"
PLUGIN = "tether_evidence"
REPORT = "report"
EXIT_CODE = "exit code"
MAX_REPORT_BYTES = 8 * 1024 * 1024
MAX_REPORTS = 20
SHOWN = 5
# Where a sandboxed check sees the plugin and its report directory (bound read-only and writable).
PLUGIN_DIR_SEEN = "/run/tether-evidence/plugin"
REPORT_DIR_SEEN = "/run/tether-evidence/reports"


def is_pytest(argv: Sequence[str]) -> bool:
    """Whether a check's command runs pytest directly (`pytest …`, `py.test …`, `python -m pytest …`)."""
    if not argv:
        return False
    if os.path.basename(str(argv[0])) in ("pytest", "py.test"):
        return True
    args = [str(a) for a in argv]
    return any(a == "-m" and b == "pytest" for a, b in zip(args, args[1:], strict=False)) or "-mpytest" in args


def env(plugin_dir: str, report_dir: str) -> dict[str, str]:
    """The environment that loads the plugin, puts checks in safe-path mode and names the report directory."""
    return {
        "PYTHONSAFEPATH": "1",
        "PYTHONPATH": plugin_dir,
        "PYTEST_PLUGINS": PLUGIN,
        "TETHER_EVIDENCE_DIR": report_dir,
    }



def reports(directory: Path) -> list[dict[str, Any]]:
    """The reports the check's sessions wrote (regular files only, bounded), oldest first."""
    found = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))[:MAX_REPORTS]
    except OSError:
        return []
    for name in names:
        try:
            fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = handle.read(MAX_REPORT_BYTES + 1)
        if len(data) > MAX_REPORT_BYTES:
            continue
        try:
            report = json.loads(data)
        except ValueError:
            continue
        if isinstance(report, dict):
            found.append(report)
    return found


FAILED_NAMED = 50  # failing tests a check's result names; the rest are counted


def tally(found: Sequence[dict[str, Any]]) -> tuple[int, tuple[str, ...]] | None:
    """How many tests the reports say ran, and which failed (None without a report). Pure.

    Stored with the check's result, so a run's change card can show the failing tests over the
    iterations without running anything again.
    """
    if not found:
        return None
    outcomes: dict[str, str] = {}
    for report in found:
        raw = report.get("outcomes")
        outcomes.update({str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {})
    return len(outcomes), tuple(sorted(nodeid for nodeid, outcome in outcomes.items() if outcome == "failed"))


@dataclass(frozen=True)
class Judgement:
    evidence: str  # REPORT or EXIT_CODE
    ok: bool
    summary: str  # one line for the verdict and the run page: "3 of 3 baseline tests ran and passed"


def strings(value: Any) -> list[str]:
    """A report's list of names (node ids) as strings; [] when what it holds is no list."""
    return [str(v) for v in value] if isinstance(value, list) else []


def deselected_count(report: dict[str, Any]) -> int | None:
    """A report's count of deselected tests (0 when it has none), or None when what it says is no count.

    The check's process writes its reports, and it runs the workspace's code: a report may say anything.
    """
    value = report.get("deselected") or 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def judge(
    found: Sequence[dict[str, Any]], *, pytest_check: bool, baseline: dict[str, Any] | None, required: bool = False
) -> Judgement:
    """Judge one check's reports against the run's baseline (see the module's docstring)."""
    if not found:
        if pytest_check or required:
            return Judgement(
                REPORT, False,
                "no test report: the test session never finished (the process exited early, e.g. os._exit, "
                "or crashed), or the command ran no pytest",
            )
        return Judgement(EXIT_CODE, True, "exit code only (no test report)")
    collected: list[str] = []
    outcomes: dict[str, str] = {}
    deselected = 0
    for report in found:
        if report.get("complete") is not True:
            return Judgement(REPORT, False, "the test report is incomplete")
        if report.get("collect_only"):
            return Judgement(REPORT, False, "the tests were only collected, none ran (--collect-only)")
        collected += strings(report.get("collected"))
        raw = report.get("outcomes")
        outcomes.update({str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {})
        if (count := deselected_count(report)) is None:
            return Judgement(REPORT, False, "the test report is malformed: its count of deselected tests is no count")
        deselected += count
    ran = [nodeid for nodeid in collected if nodeid in outcomes]
    summary = f"{len(ran)} of {len(collected)} collected tests ran"
    if len(ran) < len(collected):
        return Judgement(REPORT, False, f"{summary}: {len(collected) - len(ran)} collected tests never ran")
    if baseline is None:
        return Judgement(REPORT, True, summary + " (no baseline)")
    base = strings(baseline.get("collected"))
    base_deselected = int(baseline.get("deselected") or 0)
    if deselected > base_deselected:
        return Judgement(
            REPORT, False, f"{summary}; {deselected} tests deselected, {base_deselected} at the start of the run"
        )
    missing = [nodeid for nodeid in base if outcomes.get(nodeid) not in ("passed", "xfailed")]
    good = len(base) - len(missing)
    summary = f"{good} of {len(base)} tests present at the start ran and passed; {summary}"
    if missing:
        names = ", ".join(missing[:SHOWN]) + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
        return Judgement(REPORT, False, f"{summary}; not passed: {names}")
    return Judgement(REPORT, True, summary)
