"""Tracing's cost to a run: runs with tracing off against runs exporting to a collector that is down.

Not a test. In a throwaway SQLite database and TETHER_HOME, one `command` agent (a program that
prints a line, two iterations, no checks) is driven to its end `--runs` times each way,
interleaved: tracing off (no OTEL_EXPORTER_OTLP_ENDPOINT), then tracing on with the endpoint a
port nothing listens on. Spans go out through the SDK's batch processor, off the run's thread,
so the run should not wait on the collector; the figure is the ratio of the medians (1.00: no
cost), and the spans the down collector refused, as `/metrics` counts them.

Run: python -m bench.tracing_bench [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _harness as h


def _dead_endpoint() -> str:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def measure(runs: int, home: str) -> dict[str, Any]:
    h.migrated_backend("sqlite", home, "")
    from django.contrib.auth import get_user_model

    from instances.models import Instance
    from loops import leases, runner, services
    from tether import tracing

    user = get_user_model().objects.create_user("tracing-bench")
    workspace = Path(home) / "workspaces" / "bench"
    workspace.mkdir(parents=True)
    instance = Instance.objects.create(
        owner=user,
        name="bench",
        command=["python3", "-c", "print('did it')"],
        checks=[],
        max_iterations=2,
        workspace=str(workspace),
    )
    dead = _dead_endpoint()

    def one(endpoint: str | None) -> float:
        if endpoint:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        else:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        tracing.reset()
        run = services.run_start(instance=instance, user=user, objective="bench")
        began = time.perf_counter()
        lease = leases.claim(run.pk, run.next_iteration, "bench")
        assert lease is not None
        runner.drive(lease, slice_seconds=3600.0)
        return time.perf_counter() - began

    one(None)  # warm: imports, the sandbox's first spawn
    off: list[float] = []
    down: list[float] = []
    for _ in range(runs):
        off.append(one(None))
        down.append(one(dead))
    tracing.flush(timeout_seconds=1.0)
    tracing.reset()
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return {
        "runs": runs,
        "off_median_s": round(statistics.median(off), 3),
        "down_median_s": round(statistics.median(down), 3),
        "ratio": round(statistics.median(down) / statistics.median(off), 3),
        "spans_dropped": tracing.dropped(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    home = tempfile.mkdtemp(prefix="tether-tracing-bench-")
    try:
        figures = measure(args.runs, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{figures['runs']} runs each way, interleaved, 2 iterations each")
    print(f"  tracing off                {figures['off_median_s']:>7.3f} s (median)")
    print(f"  collector down             {figures['down_median_s']:>7.3f} s (median)")
    print(f"  ratio down / off           {figures['ratio']:>7.3f}")
    print(f"  spans dropped (/metrics)   {figures['spans_dropped']:>7}")


if __name__ == "__main__":
    main()
