"""Per-iteration overhead of the loop, against its floors, on SQLite and PostgreSQL.

For each backend, in a throwaway database, measured in the same run:
- loop: a run driven by a worker's driver, iteration after iteration, with an act that returns
  at once (an in-process brain registered through TETHER_BRAINS) and full bookkeeping: lease
  fence, reservation and settlement, workspace fingerprint, policy, iteration row, events;
- command loop: the same with the `command` brain and a check (two tiny `sh` processes), beside
  the cost of spawning those two processes alone;
- db floor: a bare insert + update + commit on the same database;
- queue hop: a django-q2 task that enqueues the next (a real qcluster, ORM broker).

- durable step: the baseline a DBOS-style durable step pays (read the workflow's state, write the
  step's row, commit), so the loop's overhead reads as a multiple of it with no external package;
- statements and commits per iteration, counted on the driver's connection;
- ten one-row writes in one transaction: an iteration's pinned statement count with nothing of
  Tether's around it, so what the statements alone cost reads apart from the Python around them.

Run: python -m bench.loop_bench   (PostgreSQL column when 127.0.0.1:5432 answers)
     python -m bench.loop_bench --json   (one line per backend: backend, overhead_ms, baseline_ms,
                                          statements, commits)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._harness import drop_database, fresh_database, migrated_backend, pg_available

ROOT = Path(__file__).resolve().parent.parent
PG_DB = "tether_bench_loop"
ITERATIONS = 300


def _setup(backend: str, home: str) -> None:
    migrated_backend(backend, home, PG_DB)


def hop(remaining: int, started: float, marker: str) -> None:
    """A no-op task that enqueues the next one; the last writes the elapsed time."""
    from django_q.tasks import async_task

    if remaining <= 0:
        Path(marker).write_text(str(time.perf_counter() - started))
        return
    async_task("bench.loop_bench.hop", remaining - 1, started, marker)


class InstantBrain:
    """An act that returns at once, changing the workspace a little (so the loop goes on)."""

    def __init__(self, instance):
        self.instance = instance

    def act(self, request):
        from instances.brains.base import Reply, Usage

        request.workspace.mkdir(parents=True, exist_ok=True)
        (request.workspace / "n").write_text(str(request.iteration))
        return Reply(
            ok=False, text="ok", usage=Usage(cost_micros=10), detail=f"step {request.iteration} not there yet"
        )


def measure(backend: str) -> dict[str, float]:
    home = tempfile.mkdtemp(prefix=f"tether-bench-{backend}-")
    _setup(backend, home)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from instances.brains import process
    from instances.models import Instance
    from loops import leases, runner, services
    from loops.models import Event, Run

    settings.TETHER_BRAINS = {"instant": "bench.loop_bench.InstantBrain"}
    user = get_user_model().objects.create_user("bench")
    workspace = Path(home) / "workspaces" / "ws"  # inside the workspaces area, as a real one is
    workspace.mkdir(parents=True)
    act = ["sh", "-c", "echo $TETHER_ITERATION > n"]
    check = ["sh", "-c", "cat n; exit 1"]
    inst = Instance.objects.create(
        owner=user,
        name="bench",
        command=act,
        workspace=str(workspace),
        checks=[{"name": "c", "command": check, "required": True}],
        max_iterations=ITERATIONS,
    )
    results: dict[str, float] = {}

    # spawn floor: the same two programs through the same launcher (the sandbox, when it is on)
    from instances.sandbox import Spec

    env = process.base_env(workspace)
    env["TETHER_ITERATION"] = "1"
    spec = Spec(workspace=workspace, instance_id=inst.pk)
    t0 = time.perf_counter()
    for _ in range(100):
        process.run(act, cwd=workspace, env=env, timeout=10, spec=spec)
        process.run(check, cwd=workspace, env=env, timeout=10, spec=spec)
    results["spawn_ms"] = (time.perf_counter() - t0) / 100 * 1000

    def drive(instance):
        run = services.run_start(instance=instance, user=user, objective="bench")
        lease = leases.claim(run.pk, 1, "bench")
        t0 = time.perf_counter()
        runner.drive(lease, slice_seconds=3600)
        elapsed = time.perf_counter() - t0
        run.refresh_from_db()
        assert run.outcome == "max_iterations", (run.outcome, run.outcome_detail)
        return run, elapsed / run.iterations_done * 1000

    instant = Instance.objects.create(
        owner=user,
        name="instant",
        brain="instant",
        workspace=str(Path(home) / "workspaces" / "ws2"),
        max_iterations=ITERATIONS,
    )
    run, results["overhead_ms"] = drive(instant)
    results["iterations_per_s"] = 1000 / results["overhead_ms"]
    # The same loop again, counting what it sends to the database (this thread's connection).
    counted = Instance.objects.create(
        owner=user, name="counted", brain="instant", workspace=str(Path(home) / "workspaces" / "ws3"), max_iterations=50
    )
    tally = {"statements": 0, "commits": 0}

    def count_statement(execute, sql, params, many, context):
        tally["statements"] += 1
        return execute(sql, params, many, context)

    real_commit = connection.commit

    def count_commit():
        tally["commits"] += 1
        return real_commit()

    connection.commit = count_commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(count_statement):
            counted_run, _ = drive(counted)
    finally:
        del connection.commit
    results["statements"] = tally["statements"] / counted_run.iterations_done
    results["commits"] = tally["commits"] / counted_run.iterations_done
    _, results["command_loop_ms"] = drive(inst)

    # db floor: insert + update + commit
    t0 = time.perf_counter()
    from django.utils import timezone

    for i in range(500):
        with transaction.atomic():
            Event.objects.create(run=run, seq=100000 + i, kind="bench", data={}, created_at=timezone.now())
            Run.objects.filter(pk=run.pk).update(last_seq=100000 + i)
    results["db_floor_ms"] = (time.perf_counter() - t0) / 500 * 1000

    # durable step (what a DBOS-style step costs): read the workflow's state, write the step's row, commit
    t0 = time.perf_counter()
    for i in range(500):
        with transaction.atomic():
            state = Run.objects.filter(pk=run.pk).values_list("status", "last_seq").get()
            Event.objects.create(run=run, seq=200000 + i, kind="step", data={"state": state[0]}, created_at=timezone.now())
    results["baseline_ms"] = (time.perf_counter() - t0) / 500 * 1000

    # the same work as an iteration's statements, bare: ten one-row writes in one transaction (the
    # count a steady iteration is pinned at), through the same ORM — what no Python of Tether's adds to
    from django.db.models import F

    t0 = time.perf_counter()
    for _ in range(200):
        with transaction.atomic():
            for _ in range(10):
                Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + 1)
    results["ten_statements_ms"] = (time.perf_counter() - t0) / 200 * 1000

    # queue hop
    connection.close()
    marker = Path(home) / "hop.txt"
    env = dict(os.environ, TETHER_QUEUE_POLL=os.environ.get("TETHER_QUEUE_POLL", "0.05"))
    cluster = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(2)
        hops = 50
        hop_started = time.perf_counter()
        from django_q.tasks import async_task

        async_task("bench.loop_bench.hop", hops, hop_started, str(marker))
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        results["queue_hop_ms"] = (
            float(marker.read_text()) / (hops + 1) * 1000 if marker.exists() else float("nan")
        )
    finally:
        os.killpg(cluster.pid, 9)
        cluster.wait()
    results["overhead_vs_db_floor"] = results["overhead_ms"] / results["db_floor_ms"]
    results["overhead_vs_baseline"] = results["overhead_ms"] / results["baseline_ms"]
    results["ten_vs_baseline"] = results["ten_statements_ms"] / results["baseline_ms"]
    return results


def main(as_json: bool = False) -> None:
    backends = ["sqlite"] + (["postgres"] if pg_available() else [])
    table: dict[str, dict[str, float]] = {}
    for backend in backends:
        if backend == "postgres":
            fresh_database(PG_DB)
        env = dict(os.environ)
        if backend == "postgres":
            env["REDIS_URL"] = env.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        out = subprocess.run(
            [sys.executable, "-m", "bench.loop_bench", "--one", backend],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"loop bench on {backend} failed")
        table[backend] = json.loads(out.stdout.strip().splitlines()[-1])
        if backend == "postgres":
            drop_database(PG_DB)
    if as_json:
        for backend in backends:
            found = table[backend]
            keys = ("overhead_ms", "baseline_ms", "statements", "commits")
            print(json.dumps({"backend": backend, **{k: round(found[k], 3) for k in keys}}))
        return
    rows = [
        ("iterations/s, act returns at once", "iterations_per_s", "{:.1f}"),
        ("platform overhead, ms per iteration", "overhead_ms", "{:.2f}"),
        ("command brain + 1 check, ms per iteration", "command_loop_ms", "{:.2f}"),
        ("  spawning those two processes alone, ms", "spawn_ms", "{:.2f}"),
        ("bare insert + update + commit, ms", "db_floor_ms", "{:.2f}"),
        ("overhead ÷ bare commit", "overhead_vs_db_floor", "{:.1f}×"),
        ("durable step (read state, write step, commit), ms", "baseline_ms", "{:.2f}"),
        ("overhead ÷ durable step", "overhead_vs_baseline", "{:.1f}×"),
        ("ten one-row writes in one transaction, ms", "ten_statements_ms", "{:.2f}"),
        ("  ÷ durable step", "ten_vs_baseline", "{:.1f}×"),
        ("statements per iteration (driver's connection)", "statements", "{:.1f}"),
        ("commits per iteration (driver's connection)", "commits", "{:.1f}"),
        ("django-q2 chained no-op task hop, ms", "queue_hop_ms", "{:.1f}"),
    ]
    print(f"\nLoop overhead ({ITERATIONS} iterations per run)")
    print(f"{'':48}" + "".join(f"{b:>14}" for b in backends))
    for label, key, fmt in rows:
        print(f"{label:48}" + "".join(f"{fmt.format(table[b][key]):>14}" for b in backends))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2])))
    elif sys.argv[1:] in ([], ["--json"]):
        main(as_json=sys.argv[1:] == ["--json"])
    else:
        raise SystemExit("usage: python -m bench.loop_bench [--json]")
