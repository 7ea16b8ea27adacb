"""Stuck loops: the classic policy against the policy that sees progress, on the same scripted agents.

Not a test. In a throwaway SQLite database and TETHER_HOME, each scripted agent below is run three
times through the real runner (`runner.drive`, the `checks` decider, one real check in the sandbox):
once with `TETHER_STALL_ITERATIONS=0` (the classic no-progress rules only: an instruction repeated,
the workspace and checks unchanged three times), once with the default K (3), and once with K and
the instance's `rewind_on_stall` on (a stall after the nudge restores the workspace to the best
iteration's snapshot, through the rollback, and asks for a different approach). An agent is an
in-process brain (registered through TETHER_BRAINS) that writes, on each iteration, a workspace
decided by its script: a tree (the same label is byte-for-byte the same workspace, so an
oscillator really returns to an earlier tree) and a test report in pytest's words (`7 failed, 13
passed in 0.05s`, with the failing tests named) that the check prints; the check passes when
nothing is left. Every act reports $0.02 of its own spend; every run may take 30 iterations.

Each agent has a known right outcome: a fixer (steady, slow, bumpy, fast, regressing and
recovering) must end `done`; a stuck one (a churner that edits every time while the count stays,
an oscillator that goes round the same trees) must be stopped or handed to a person (`escalated`
or `no_progress`) before its cap. Two agents make things worse and worse after a good start: one
recovers once its workspace is rewound to its best state (right: `done`, which only a rewind gets
it to), one stays stuck after the rewind too (right: handed to a person). An agent that finds its
workspace rewound (the brief of the iteration it was rewound after names `rewound_to`) follows its
`after_rewind` script from there. The table shows, per agent and policy, the outcome, the
iteration it ended on, the money spent and whether the outcome is right.

Run: python -m bench.stall_bench [--json]   (or: python -m bench stall_bench)
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _harness as h

MAX_ITERATIONS = 30
COST_MICROS = 20_000  # $0.02 per act, reported by the agent
TESTS = 20  # tests in the scripted suite
CHECK = ["sh", "-c", 'cat report; test "$(cat left)" = 0']
POLICIES = (("classic", 0, False), ("progress", 3, False), ("rewind", 3, True))  # (name, K, rewind_on_stall)


@dataclass(frozen=True)
class Agent:
    """A scripted agent: per iteration, the workspace it leaves (a tree label and what is left to fix).

    `steps[n - 1]` is iteration n's (tree, left); past the end the last step repeats with a fresh
    tree for a churner (`churns`), the same tree otherwise. `right` is "done" or "stuck".
    """

    name: str
    kind: str
    right: str
    steps: tuple[tuple[str, int], ...]
    churns: bool = False
    counted: bool = True  # False: the check prints no count (nothing to see progress by)
    after_rewind: tuple[tuple[str, int], ...] = ()  # once rewound: the steps from there (the last repeats)

    def step(self, iteration: int, rewound_at: int = 0) -> tuple[str, int]:
        if rewound_at and self.after_rewind:
            return self.after_rewind[min(iteration - rewound_at, len(self.after_rewind)) - 1]
        if iteration <= len(self.steps):
            return self.steps[iteration - 1]
        tree, left = self.steps[-1]
        if self.churns:
            return f"{tree}-{iteration}", left
        return tree, left


def _cycle(trees: str, left: int, times: int = MAX_ITERATIONS) -> tuple[tuple[str, int], ...]:
    return tuple((trees[i % len(trees)], left) for i in range(times))


def _steady(counts: list[int]) -> tuple[tuple[str, int], ...]:
    return tuple((f"fix{i}", n) for i, n in enumerate(counts))


AGENTS = (
    Agent("churner-7", "churner", "stuck", (("c1", 7),), churns=True),
    Agent("churner-4-5", "churner", "stuck", tuple((f"c{i}", 4 + i % 2) for i in range(MAX_ITERATIONS))),
    Agent(
        "churner-creeping", "churner", "stuck", tuple((f"c{i}", 5 + i // 4) for i in range(MAX_ITERATIONS))
    ),
    Agent("oscillator-AB", "oscillator", "stuck", _cycle("AB", 4)),
    Agent("oscillator-ABC", "oscillator", "stuck", _cycle("ABC", 4)),
    Agent("oscillator-ABCD", "oscillator", "stuck", _cycle("ABCD", 6)),
    Agent("steady-slow", "slow-but-steady", "done", _steady(list(range(12, -1, -1)))),
    Agent("steady-bumpy", "slow-but-steady", "done", _steady([n for n in range(10, -1, -1) for _ in (0, 1)])),
    Agent(
        "steady-plateaus",
        "slow-but-steady",
        "done",
        _steady([n for n in range(5, -1, -1) for _ in range(4)][:-3]),
    ),
    Agent("fast-fixer", "fast fixer", "done", _steady([6, 0])),
    Agent("one-shot", "fast fixer", "done", _steady([0])),
    Agent(
        "regress-revert",
        "regress-and-recover",
        "done",
        (("r1", 6), ("r2", 4), ("r3", 9), ("r2", 4), ("r5", 2), ("r6", 0)),
    ),
    Agent("regress-stay", "regress-and-recover", "done", _steady([5, 8, 8, 3, 1, 0])),
    Agent(
        "worse-then-rewound",
        "regress until rewound",
        "done",
        tuple((f"w{i}", n) for i, n in enumerate([5, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])),
        after_rewind=(("w-new-1", 2), ("w-new-2", 0)),
    ),
    Agent(
        "worse-stuck",
        "regress, stuck rewound",
        "stuck",
        tuple((f"x{i}", n) for i, n in enumerate([5, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])),
        after_rewind=tuple((f"x-new-{i}", 4) for i in range(MAX_ITERATIONS)),
    ),
    Agent("churner-silent", "churner (no count)", "stuck", (("s1", 3),), churns=True, counted=False),
)


def report(agent: Agent, tree: str, left: int) -> str:
    """What the scripted suite prints for `tree`: the failing tests (which ones depend on the tree), then pytest's summary."""
    seed = sum(ord(c) for c in tree)
    failing = sorted({(seed + 3 * i) % TESTS for i in range(left)})
    while len(failing) < left:
        failing.append(len(failing) + TESTS)
    lines = [f"FAILED tests/test_app.py::test_case_{n} - AssertionError: case {n} ({tree})" for n in failing]
    if agent.counted:
        lines.append(f"{left} failed, {TESTS - left} passed in 0.05s" if left else f"{TESTS} passed in 0.05s")
    return "\n".join(lines) + "\n"


class ScriptedBrain:
    """The agent named by the instance: it leaves the workspace its script says for this iteration."""

    def __init__(self, instance: Any) -> None:
        self.agent = next(a for a in AGENTS if a.name == instance.name.split("/")[0])

    def unmetered_reserve(self) -> int:
        return COST_MICROS

    def act(self, request: Any) -> Any:
        from instances.brains.base import Reply, Usage

        rewound_at = max((int(s.get("iteration") or 0) for s in request.snapshot if s.get("rewound_to")), default=0)
        tree, left = self.agent.step(request.iteration, rewound_at)
        workspace = Path(request.workspace)
        workspace.mkdir(parents=True, exist_ok=True)
        app = workspace / "app.py"
        found = app.read_text().partition("STATE = ")[2].strip() if app.exists() else "none"
        app.write_text(f"# the code as tree {tree} has it\nSTATE = {tree!r}\n")
        (workspace / "report").write_text(report(self.agent, tree, left))
        (workspace / "left").write_text(str(left))
        text = f"found tree {found}; edited app.py (tree {tree})"
        return Reply(ok=True, text=text, usage=Usage(cost_micros=COST_MICROS))


def measure(home: str) -> list[dict[str, Any]]:
    h.migrated_backend("sqlite", home, "")
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from instances.models import Instance
    from loops import leases, runner, services
    from loops.models import Run

    settings.TETHER_BRAINS = {"scripted": "bench.stall_bench.ScriptedBrain"}
    user = get_user_model().objects.create_user("stall-bench")
    rows = []
    for agent in AGENTS:
        for policy, stale_after, rewind in POLICIES:
            settings.TETHER_STALL_ITERATIONS = stale_after
            instance = Instance.objects.create(
                owner=user,
                name=f"{agent.name}/{policy}",
                brain="scripted",
                max_iterations=MAX_ITERATIONS,
                workspace=str(Path(home) / "workspaces" / f"{agent.name}-{policy}"),
                checks=[{"name": "tests", "command": CHECK, "required": True}],
                rewind_on_stall=rewind,
            )
            run = services.run_start(instance=instance, user=user, objective="make the tests pass")
            lease = leases.claim(run.pk, 1, "stall-bench")
            assert lease is not None
            runner.drive(lease, slice_seconds=3600)
            run = Run.objects.get(pk=run.pk)
            rows.append(row(agent, policy, run))
    return rows


def row(agent: Agent, policy: str, run: Any) -> dict[str, Any]:
    """One line of the table: how the run ended, when, what it spent, and whether that is right."""
    outcome = "escalated" if run.status == "waiting" else run.outcome
    right = outcome == "done" if agent.right == "done" else outcome in ("escalated", "no_progress")
    return {
        "agent": agent.name,
        "kind": agent.kind,
        "right_outcome": agent.right,
        "policy": policy,
        "outcome": outcome,
        "iterations": run.iterations_done,
        "spent_micros": run.spent_micros,
        "right": right,
        "detail": run.outcome_detail,
    }


def table(rows: list[dict[str, Any]]) -> str:
    from budgets.money import format_usd

    by = {(r["agent"], r["policy"]): r for r in rows}
    lines = [
        f"\nStuck loops: classic policy vs the policy that sees progress (K=3), without and with rewind_on_stall, "
        f"{len(AGENTS)} scripted agents, cap {MAX_ITERATIONS} iterations, $0.02 per act",
        f"{'agent':18} {'kind':22} {'right':6} | {'classic':28} | {'sees progress':28} | {'sees progress, rewinds':28}",
    ]
    for agent in AGENTS:
        cells = []
        for policy, _, _ in POLICIES:
            r = by[(agent.name, policy)]
            mark = "ok" if r["right"] else "WRONG"
            cells.append(
                f"{r['outcome']:15} {r['iterations']:>2} {format_usd(r['spent_micros']):>7} {mark:5}"
            )
        lines.append(f"{agent.name:18} {agent.kind:22} {agent.right:6} | " + " | ".join(f"{c:28}" for c in cells))
    for group in ("stuck", "done"):
        sums = []
        for policy, _, _ in POLICIES:
            chosen = [by[(a.name, policy)] for a in AGENTS if a.right == group]
            right = sum(r["right"] for r in chosen)
            sums.append(
                f"{right}/{len(chosen)} right, {format_usd(sum(r['spent_micros'] for r in chosen)):>7} spent"
            )
        lines.append(f"{'total, ' + group:48} | " + " | ".join(f"{s:28}" for s in sums))
    return "\n".join(lines)


def main(as_json: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="tether-bench-stall-") as home:
        rows = measure(home)
    if as_json:
        for r in rows:
            print(json.dumps({k: v for k, v in r.items() if k != "detail"}))
        return
    print(table(rows))


if __name__ == "__main__":
    if sys.argv[1:] in ([], ["--json"]):
        main(as_json=sys.argv[1:] == ["--json"])
    else:
        raise SystemExit("usage: python -m bench.stall_bench [--json]")
