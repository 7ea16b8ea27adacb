"""Tether's pytest plugin: what a check's test session ran, written where the workspace cannot reach.

Loaded into every check's pytest through `PYTEST_PLUGINS` from a read-only directory outside the
workspace; it writes one JSON report per session into `TETHER_EVIDENCE_DIR` (a directory bound
for this check alone) when the session finishes. A session that never finishes (`os._exit`, a
crash, a kill) leaves no report. Code under test runs in this same process and could still lie
to it; the report is evidence that pytest ran the tests as collected, not proof.
"""

from __future__ import annotations

import json
import os
import time

_state: dict = {"collected": [], "deselected": 0, "outcomes": {}}


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")  # under pytest-xdist, only the controller writes


def pytest_deselected(items) -> None:
    _state["deselected"] += len(items)


def pytest_collection_finish(session) -> None:
    _state["collected"] = [item.nodeid for item in session.items]


def pytest_runtest_logreport(report) -> None:
    outcomes = _state["outcomes"]
    if report.failed:
        outcomes[report.nodeid] = "failed"
    elif report.skipped and report.when in ("setup", "call"):
        outcomes[report.nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.passed and report.when == "call":
        outcomes.setdefault(report.nodeid, "passed")


def pytest_sessionfinish(session, exitstatus) -> None:
    where = os.environ.get("TETHER_EVIDENCE_DIR")
    if not where or not _controller(session.config):
        return
    report = {
        "runner": "pytest",
        "complete": True,
        "collect_only": bool(session.config.getoption("collectonly", False)),
        "exit_status": int(exitstatus),
        "collected": _state["collected"],
        "deselected": _state["deselected"],
        "outcomes": _state["outcomes"],
    }
    path = os.path.join(where, f"pytest-{os.getpid()}-{time.monotonic_ns()}.json")
    with open(path + ".part", "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(path + ".part", path)
