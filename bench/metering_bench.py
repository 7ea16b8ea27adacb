"""Metering's cost per model call, as a ratio to a bare reserve + settle pair in the same run.

Not a test. In a throwaway SQLite database (and a throwaway PostgreSQL database when
127.0.0.1:5432 answers), for one capped run, interleaved round by round:
- bare pair: `ledger.hold` + `ledger.settle` of a fixed amount (what the ledger costs);
- metered call: `RunMeter.before` (price lookup, the chain's headroom, clamping, reserve) +
  `RunMeter.after` (pricing the usage, settle, the call's tokens) — what every model call
  now pays before it goes out and after it answers.

Run: python -m bench.metering_bench [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from bench._harness import drop_database, fresh_database, migrated_backend, pg_available

PG_DB = "tether_bench_metering"
CALLS = 300


def _setup(backend: str, home: str) -> None:
    migrated_backend(backend, home, PG_DB)


def _measure(calls: int) -> tuple[list[float], list[float]]:
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from budgets import ledger
    from budgets.metering import RunMeter
    from budgets.models import Price
    from instances.brains.base import Usage
    from instances.models import Instance
    from loops import services

    Price.objects.update_or_create(
        model="bench-model",
        defaults=dict(input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
                      cache_write_usd_per_mtok=Decimal("3.75"), cache_read_usd_per_mtok=Decimal("0.30"),
                      effective_from=timezone.now().date().replace(year=2020)),
    )
    user = get_user_model().objects.create_user("bench")
    instance = Instance.objects.create(owner=user, name="bench", command=["true"], workspace=tempfile.mkdtemp())
    run = services.run_start(instance=instance, user=user, objective="bench", max_cost_usd="100000")
    meter = RunMeter(run, 1)
    usage = Usage(model="bench-model", input_tokens=2000, output_tokens=300, cache_read_tokens=1000)
    bare: list[float] = []
    metered: list[float] = []
    for i in range(calls):
        started = time.perf_counter()
        held = ledger.hold(run=run, iteration=2 + i, amount=5000).pk
        ledger.settle(held, actual=4000)
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        grant = meter.before(model="bench-model", request_bytes=12_000, max_tokens=4096)
        meter.after(grant, usage)
        metered.append(time.perf_counter() - started)
    return bare, metered


def main(calls: int = CALLS) -> None:
    import subprocess
    import sys

    backends = ["sqlite"] + (["postgres"] if pg_available() else [])
    print(f"per model call, median of {calls} interleaved rounds (ms)")
    print(f"{'backend':>9} | {'bare reserve+settle':>20} | {'metered call':>14} | ratio")
    for backend in backends:
        done = subprocess.run(
            [sys.executable, "-m", "bench.metering_bench", "--one", backend, "--calls", str(calls)],
            capture_output=True, text=True, timeout=600,
        )
        if done.returncode != 0:
            print(f"{backend:>9} | failed: {done.stderr.strip()[-500:]}")
            continue
        print(done.stdout.rstrip().splitlines()[-1])


def one(backend: str, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tether-bench-metering-") as home:
        if backend == "postgres":
            fresh_database(PG_DB)
        try:
            _setup(backend, home)
            bare, metered = _measure(calls)
        finally:
            if backend == "postgres":
                from django.db import connections

                connections.close_all()
                drop_database(PG_DB)
    b, m = statistics.median(bare) * 1000, statistics.median(metered) * 1000
    print(f"{backend:>9} | {b:20.2f} | {m:14.2f} | {m / b:5.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--one", choices=["sqlite", "postgres"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.calls)
    else:
        main(args.calls)
