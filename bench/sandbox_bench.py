"""The sandbox's cost per act, as a ratio to an unsandboxed spawn measured in the same run.

Each round runs the same tiny program (`sh -c 'echo ok > out'`) through `instances.brains.process.run`
(the path every command-brain act and check takes) three ways, interleaved so the machine's load
falls on all of them alike:
- unsandboxed: `TETHER_SANDBOX=off` (what a single-user development install does);
- sandboxed: bubblewrap, the instance's own uid, resource limits, no network;
- sandboxed with egress: the same plus slirp4netns (an instance granted network).
Twice: in a workspace of 10 files and of 2,000 files (the sandbox hands the workspace tree to
the instance's uid before each act, so it walks it).

Then a pytest check's start in the sandbox (`python -m pytest --collect-only` over three tests, as
every pytest check's baseline runs it), with the interpreter's bytecode the server compiled once
(`TETHER_SANDBOX_BYTECODE=1`, the default: instances/bytecode.py) and without it (each sandbox
compiling what it imports, pytest rewriting its plugins' modules), interleaved.

Run: python -m bench.sandbox_bench [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

ROUNDS = 40


def _setup(home: str) -> None:
    os.environ["TETHER_HOME"] = home
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tether.settings")
    import django

    django.setup()


def _workspace(root: Path, files: int) -> Path:
    workspace = root / f"ws-{files}"
    for i in range(files):
        folder = workspace / f"d{i // 100}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.txt").write_text("x")
    workspace.mkdir(parents=True, exist_ok=True)
    return workspace


def _once(workspace: Path, mode: str) -> float:
    from django.conf import settings

    from instances.brains import process
    from instances.sandbox import Spec

    settings.TETHER_SANDBOX = "off" if mode == "unsandboxed" else "bwrap"
    spec = Spec(workspace=workspace, instance_id=1, network=mode == "egress")
    started = time.perf_counter()
    done = process.run(["sh", "-c", "echo ok > out"], cwd=workspace, env=process.base_env(workspace), timeout=30,
                       spec=spec)
    took = time.perf_counter() - started
    if done.exit_code != 0 or done.sandboxed != (mode != "unsandboxed"):
        raise SystemExit(f"{mode}: the act failed: {done}")
    return took


def main(rounds: int = ROUNDS) -> None:
    with tempfile.TemporaryDirectory(prefix="tether-bench-sandbox-") as home:
        _setup(home)
        from instances import sandbox

        if problem := sandbox.problem():
            raise SystemExit(f"the sandbox is unavailable: {problem}")
        modes = ["unsandboxed", "sandboxed", "egress"]
        print(f"per act, median of {rounds} interleaved rounds (ms); ratio to the unsandboxed spawn")
        print(f"{'workspace':>12} | " + " | ".join(f"{m:>18}" for m in modes))
        for files in (10, 2000):
            workspace = _workspace(Path(home) / "workspaces", files)  # where Tether keeps workspaces
            times: dict[str, list[float]] = {m: [] for m in modes}
            for m in modes:
                _once(workspace, m)  # warm up
            for _ in range(rounds):
                for m in modes:
                    times[m].append(_once(workspace, m))
            base = statistics.median(times["unsandboxed"])
            cells = []
            for m in modes:
                median = statistics.median(times[m])
                cells.append(f"{median * 1000:8.1f} ({median / base:4.1f}x)")
            print(f"{files:>6} files | " + " | ".join(f"{c:>18}" for c in cells))
        check_starts(Path(home))


CHECK_ROUNDS = 8
TESTS = "def test_a():\n    assert 1\n\ndef test_b():\n    assert 2\n\ndef test_c():\n    assert 3\n"


def _check_start(workspace: Path, compiled: bool) -> float:
    """One sandboxed `pytest --collect-only`: its seconds."""
    from django.conf import settings

    from instances.brains import process
    from instances.sandbox import Spec

    settings.TETHER_SANDBOX = "bwrap"
    settings.TETHER_SANDBOX_BYTECODE = compiled
    spec = Spec(workspace=workspace, instance_id=1, network=False)
    started = time.perf_counter()
    done = process.run(["python", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=workspace,
                       env=process.base_env(workspace), timeout=300, spec=spec)
    took = time.perf_counter() - started
    if done.exit_code != 0:
        raise SystemExit(f"the check failed to start: {done.stdout[-500:]} {done.stderr[-500:]}")
    return took


def check_starts(home: Path, rounds: int = CHECK_ROUNDS) -> None:
    workspace = home / "workspaces" / "pytest"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "test_three.py").write_text(TESTS)
    _check_start(workspace, True)  # the server compiles its cache once, here
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for compiled in (False, True):
            times[compiled].append(_check_start(workspace, compiled))
    base = statistics.median(times[False])
    print(f"\na pytest check's start in the sandbox, median of {rounds} interleaved rounds; ratio to compiling")
    for compiled, label in ((False, "each sandbox compiles"), (True, "server's bytecode")):
        median = statistics.median(times[compiled])
        print(f"{label:>22} | {median * 1000:8.0f} ms ({median / base:4.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    main(parser.parse_args().rounds)
