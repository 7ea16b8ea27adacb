"""Ledger throughput: reserve + settle pairs per second on one shared root pool.

Not a test. `python -m bench.ledger_bench` measures 1, 4 and 16 concurrent worker
processes (spawned, each with its own database connection) on SQLite (a throwaway
file) and, when DATABASE_URL is set, on PostgreSQL (a throwaway database,
`tether_bench_ledger`, created and dropped on the same server). Each pair is two short
transactions, as in the runner: reserve (before the act) and settle (after it). A
baseline row times the same number of pairs of bare one-row write transactions (what
any iteration writes anyway), so the ledger's cost reads as a multiple of that floor.

The worker (`hammer`) is shared with the ledger's concurrency tests, which run it
against the test database and check the books afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

BENCH_DB = "tether_bench_ledger"
SPAWN = multiprocessing.get_context("spawn")


# --- the worker --------------------------------------------------------------------------


@dataclass
class Job:
    """One worker's share: `count` reservations on `run_id` from iteration `first_iteration`."""

    env: dict[str, str | None]
    run_id: int
    first_iteration: int
    count: int
    seed: int
    max_amount: int = 1000
    settle_now: float = 1.0  # chance of settling right after reserving; the rest stay held for a while
    check_pool_ids: list[int] = field(default_factory=list)  # asserted inside every granting transaction
    baseline: bool = False  # instead of the ledger: two one-row write transactions on the run (the floor)


@dataclass
class Result:
    granted: int = 0
    refused: int = 0
    settled: int = 0
    retries: int = 0
    pairs: int = 0
    pair_seconds: float = 0.0
    start: float = 0.0
    end: float = 0.0
    held: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    error: str = ""


def configure(env: dict[str, str | None]) -> None:
    """Point this process at a database (environment overrides) and set Django up."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tether.settings")
    import django

    django.setup()


def hammer(job: Job, barrier: Any, results: Any) -> None:
    """Reserve `job.count` times (settling at random), then put a `Result` on `results`."""
    result = Result()
    try:
        configure(job.env)
        from budgets import booking, ledger, retry
        from budgets.models import Pool
        from loops.models import Run

        rng = random.Random(job.seed)
        run = Run.objects.select_related("instance").get(pk=job.run_id)

        def retried(error: Exception) -> None:
            result.retries += 1

        def check_books() -> None:
            for pool in Pool.objects.filter(pk__in=job.check_pool_ids):
                if pool.limit is not None and pool.spent + pool.reserved > pool.limit:
                    result.violations.append(
                        f"{pool.name}: spent {pool.spent} + reserved {pool.reserved} > limit {pool.limit}"
                    )

        def settle(reservation: int, amount: int) -> None:
            retry.atomic_with_retry(
                lambda: ledger.settle(reservation, actual=rng.randint(0, amount)), on_retry=retried
            )
            result.settled += 1

        held: list[tuple[int, int]] = []
        barrier.wait()
        result.start = time.monotonic()
        if job.baseline:
            _baseline(run, job.count, result)
            return
        for number in range(job.first_iteration, job.first_iteration + job.count):
            amount = rng.randint(1, job.max_amount)

            def reserve(number: int = number, amount: int = amount) -> int | None:
                reservation = ledger.hold(run=run, iteration=number, amount=amount).pk
                if job.check_pool_ids:
                    check_books()
                return reservation

            began = time.monotonic()
            try:
                reservation = retry.atomic_with_retry(reserve, on_retry=retried)
            except booking.BudgetRefused:
                result.refused += 1
                continue
            assert reservation is not None
            result.granted += 1
            if rng.random() < job.settle_now:
                settle(reservation, amount)
                result.pairs += 1
                result.pair_seconds += time.monotonic() - began
            else:
                held.append((reservation, amount))
            if held and rng.random() < 0.1:
                settle(*held.pop(rng.randrange(len(held))))
        result.end = time.monotonic()
        result.held = [reservation for reservation, _ in held]
    except BaseException:
        result.error = traceback.format_exc()
    finally:
        from django.db import connections

        connections.close_all()
        results.put(result)


def _baseline(run: Any, count: int, result: Result) -> None:
    """Time `count` pairs of the least an iteration writes anyway: two one-row transactions on its run."""
    from django.db import transaction
    from django.db.models import F

    from loops.models import Run

    for _ in range(count):
        began = time.monotonic()
        for _ in range(2):
            with transaction.atomic():
                Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + 1)
        result.pairs += 1
        result.pair_seconds += time.monotonic() - began
    result.end = time.monotonic()


def run_workers(jobs: list[Job], timeout: float = 600) -> list[Result]:
    """Run one spawned process per job, started together; return their results (raise on a crash)."""
    barrier = SPAWN.Barrier(len(jobs))
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=hammer, args=(job, barrier, results), daemon=True) for job in jobs]
    for proc in procs:
        proc.start()
    collected = []
    deadline = time.monotonic() + timeout
    try:
        for _ in jobs:
            collected.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    errors = [r.error for r in collected if r.error]
    if errors:
        raise RuntimeError("a ledger worker failed:\n" + "\n".join(errors))
    return collected


def child_env(connection: Any) -> dict[str, str | None]:
    """Return the environment that points a spawned process at `connection`'s database."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = quote(settings["USER"] or "")
        if settings.get("PASSWORD"):
            auth += ":" + quote(settings["PASSWORD"])
        host = settings.get("HOST") or "localhost"
        port = settings.get("PORT") or 5432
        return {"DATABASE_URL": f"postgres://{auth}@{host}:{port}/{settings['NAME']}"}
    return {"DATABASE_URL": None, "TETHER_SQLITE_PATH": str(settings["NAME"])}


# --- the benchmark -------------------------------------------------------------------------


def _fixtures(workers: int, tag: str) -> tuple[list[int], int]:
    """Create a user, one instance and run per worker, and their pools; return run ids and the root pool id."""
    from django.contrib.auth import get_user_model

    from budgets import services
    from instances.models import Instance
    from loops.models import Run

    user = get_user_model().objects.create_user(f"bench-{tag}")
    run_ids = []
    for n in range(workers):
        instance = Instance.objects.create(owner=user, name=f"bench-{tag}-{n}", command=["true"])
        run = Run.objects.create(
            instance=instance, owner=user, objective="bench", max_iterations=10**6, max_cost_micros=10**12
        )
        services.open_run_pools(run)
        run_ids.append(run.pk)
    root = services.root_pool()
    return run_ids, root.pk


def _backend(env: dict[str, str | None], worker_counts: list[int], pairs: int, out: Any) -> None:
    try:
        configure(env)
        from django.core.management import call_command
        from django.db import connection, connections

        from budgets import limits

        call_command("migrate", verbosity=0)
        rows = []
        for workers in worker_counts:
            run_ids, root_id = _fixtures(workers, f"{workers}")
            # A large but real limit: every reservation is checked against it.
            limits.set_limit(root_id, 10**15, "bench")
            row: dict[str, Any] = {"workers": workers}
            for baseline in (False, True):
                jobs = [
                    Job(
                        env=child_env(connection),
                        run_id=run_id,
                        first_iteration=1,
                        count=max(1, pairs // workers),
                        seed=n,
                        baseline=baseline,
                    )
                    for n, run_id in enumerate(run_ids)
                ]
                connections.close_all()
                results = run_workers(jobs)
                wall = max(r.end for r in results) - min(r.start for r in results)
                done = sum(r.pairs for r in results)
                key = "bare" if baseline else "ledger"
                row[f"{key}_per_second"] = done / wall
                row[f"{key}_ms"] = 1000 * sum(r.pair_seconds for r in results) / max(done, 1)
                row.setdefault("retries", sum(r.retries for r in results))
            row["over_admitted"] = _over_admitted()
            rows.append(row)
        out.put({"vendor": connection.vendor, "rows": rows})
    except BaseException:
        out.put({"error": traceback.format_exc()})


def _over_admitted() -> int:
    """Count pools whose books hold more than their limit (spent + reserved > limit): must be 0."""
    from django.db.models import F

    from budgets.models import Pool

    return Pool.objects.filter(limit__isnull=False, spent__gt=F("limit") - F("reserved")).count()


def _measure(label: str, env: dict[str, str | None], worker_counts: list[int], pairs: int) -> dict[str, Any]:
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=_backend, args=(env, worker_counts, pairs, out))
    proc.start()
    report = out.get(timeout=1800)
    proc.join(timeout=30)
    if "error" in report:
        raise RuntimeError(f"{label} benchmark failed:\n{report['error']}")
    report["label"] = label
    return report


def _postgres_admin(url: str, statements: list[str]) -> None:
    import psycopg

    parts = urlsplit(url)
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table (`argv` as on the command line; none from `make bench`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="reserve+settle pairs per configuration")
    parser.add_argument("--workers", default="1,4,16", help="comma-separated worker process counts")
    parser.add_argument(
        "--lease-usd",
        default=None,
        help="TETHER_BUDGET_LEASE_USD for the runs' pools (default: the setting's, 0.25; 0: no leases, "
        "every pair locks the whole chain)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON line per backend and worker count: backend, workers, pairs_per_s, over_admitted",
    )
    args = parser.parse_args(argv or [])
    counts = [int(n) for n in args.workers.split(",") if n]
    if args.lease_usd is not None:
        from decimal import Decimal, InvalidOperation

        try:
            valid = Decimal(args.lease_usd) >= 0
        except InvalidOperation:
            valid = False
        if not valid:
            parser.error(f"--lease-usd must be an amount of dollars such as 0.25 (0 or more), got {args.lease_usd!r}")
        os.environ["TETHER_BUDGET_LEASE_USD"] = args.lease_usd  # the spawned processes inherit it
    leases = os.environ.get("TETHER_BUDGET_LEASE_USD", "0.25")
    reports = []
    with tempfile.TemporaryDirectory(prefix="tether-bench-ledger-") as tmp:
        sqlite_env: dict[str, str | None] = {
            "DATABASE_URL": None,
            "TETHER_HOME": tmp,
            "TETHER_SQLITE_PATH": str(Path(tmp) / "bench.sqlite3"),
        }
        reports.append(_measure("SQLite", sqlite_env, counts, args.pairs))
        url = os.environ.get("DATABASE_URL", "")
        if url:
            bench_url = urlunsplit(urlsplit(url)._replace(path="/" + BENCH_DB))
            _postgres_admin(
                url, [f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)', f'CREATE DATABASE "{BENCH_DB}"']
            )
            try:
                reports.append(
                    _measure(
                        "PostgreSQL", {"DATABASE_URL": bench_url, "TETHER_HOME": tmp}, counts, args.pairs
                    )
                )
            finally:
                _postgres_admin(url, [f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)'])
    if args.json:
        import json

        for report in reports:
            backend = "postgres" if report["vendor"] == "postgresql" else report["vendor"]
            for row in report["rows"]:
                line = {
                    "backend": backend,
                    "workers": row["workers"],
                    "pairs_per_s": round(row["ledger_per_second"], 1),
                    "over_admitted": row["over_admitted"],
                    "lease_usd": leases,
                }
                print(json.dumps(line))
        return
    print(
        f"ledger: reserve + settle pairs on one shared root pool (chains of 4 pools), {args.pairs} pairs per row;\n"
        f"each run pool leases slices of ${leases} from its ancestors" + (" (leases off)" if float(leases) == 0 else "") + ";\n"
        "bare: the same number of pairs of one-row write transactions on each worker's own run (no ledger)"
    )
    header = f"{'database':<11} {'workers':>7} {'pairs/s':>8} {'ms/pair':>8} {'bare/s':>7} {'bare ms':>8} {'ledger/bare':>11} {'retries':>7}"
    print(header)
    for report in reports:
        for row in report["rows"]:
            print(
                f"{report['label']:<11} {row['workers']:>7} {row['ledger_per_second']:>8.0f} {row['ledger_ms']:>8.2f} "
                f"{row['bare_per_second']:>7.0f} {row['bare_ms']:>8.2f} {row['ledger_ms'] / row['bare_ms']:>10.1f}x "
                f"{row['retries']:>7}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
