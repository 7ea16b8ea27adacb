"""Pickup at fleet speed: how long N runs started at once wait for a worker to claim them.

Not a test. For each backend (SQLite; PostgreSQL + Redis when 127.0.0.1 answers), in a
throwaway database, one real `qcluster` worker cluster of `--workers` processes, and:

- baseline: N trivial django-q2 tasks enqueued in one transaction; the time from its commit
  until each task has run in a worker (what the same cluster's queue does with no Tether);
- pickup: N runs started in one transaction (`services.run_start`, a `command` agent that
  says done at once); the time from its commit until each run's first `run.claimed` event.

Both are reported as p50, p95 and max, and the pickup as a multiple of the baseline measured
in the same run. Bounded: every wait has a deadline (`--wait`), everything started is stopped.

Run: python -m bench.pickup_bench [--runs 200] [--workers 2] [--backend sqlite,postgres] [--json]
     python -m bench pickup_bench   (the defaults)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _harness as h

PG_DB = f"tether_pickup_{os.getpid()}"
USERNAME = "pickup"


def noop(marker: str) -> None:
    """The baseline's task: note when it ran (one short line, appended atomically)."""
    with open(marker, "a") as fh:
        fh.write(f"{time.time()}\n")


# --- roles (subprocesses with the backend's environment) ---------------------------------------------


def prepare(runs: int, home: str) -> dict[str, Any]:
    """Migrate; make the user and one instance per run (an agent that says done at once)."""
    h.django_setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from instances.models import Instance

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(USERNAME)
    Instance.objects.bulk_create(
        Instance(
            owner=user,
            name=f"pickup-{i}",
            command=["sh", "-c", "echo done"],
            workspace=str(Path(home) / "workspaces" / "ws" / str(i)),
            max_iterations=2,
        )
        for i in range(runs)
    )
    return {"instances": runs}


def measure(runs: int, home: str, wait: float) -> dict[str, Any]:
    """With the cluster up: the baseline's N tasks, then N runs; seconds from each commit to each pickup."""
    h.django_setup()
    from django.db import transaction
    from django_q.tasks import async_task

    from instances.models import Instance
    from loops import services
    from loops.models import Event, Run

    marker = Path(home) / "noop.txt"
    warm = Path(home) / "warm.txt"
    async_task("bench.pickup_bench.noop", str(warm))  # the cluster is up and taking work
    h.wait_until(warm.exists, 60, "the cluster's first task")

    with transaction.atomic():
        for _ in range(runs):
            async_task("bench.pickup_bench.noop", str(marker))
    began = time.time()
    h.wait_until(lambda: marker.exists() and len(marker.read_text().split()) >= runs, wait, "the baseline's tasks")
    baseline = [float(t) - began for t in marker.read_text().split()]

    instances = list(Instance.objects.select_related("owner").filter(owner__username=USERNAME).order_by("pk"))
    with transaction.atomic():
        ids = [services.run_start(instance=i, user=i.owner, objective="say done").pk for i in instances]
    began = time.time()

    def claimed() -> dict[int, float]:
        first: dict[int, float] = {}
        for run_id, at in Event.objects.filter(run_id__in=ids, kind="run.claimed").values_list("run_id", "created_at"):
            first[run_id] = min(first.get(run_id, at.timestamp()), at.timestamp())
        return first

    ends = time.monotonic() + wait
    while len(found := claimed()) < len(ids) and time.monotonic() < ends:
        time.sleep(0.1)
    ends = time.monotonic() + 15  # let them finish, so the outcomes say the runs were real
    while Run.objects.filter(pk__in=ids).exclude(status="finished").exists() and time.monotonic() < ends:
        time.sleep(0.2)
    outcomes: dict[str, int] = {}
    for outcome in Run.objects.filter(pk__in=ids).values_list("outcome", flat=True):
        outcomes[outcome or "unfinished"] = outcomes.get(outcome or "unfinished", 0) + 1
    return {
        "baseline": baseline,
        "pickup": [at - began for at in found.values()],
        "unclaimed": len(ids) - len(found),
        "outcomes": outcomes,
    }


# --- orchestration --------------------------------------------------------------------------------------


def one_backend(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"tether-pickup-{backend}-"))
    (home / "logs").mkdir()
    redis = h.redis_url() if backend == "postgres" else None
    extra = {"TETHER_WORKERS": str(args.workers)}
    if backend == "postgres":
        h.fresh_database(PG_DB)
        extra["DATABASE_URL"] = h.database_url(PG_DB, "tether-pickup")
        if redis:
            extra["REDIS_URL"] = redis
    else:
        extra["TETHER_SQLITE_PATH"] = str(home / "pickup.sqlite3")
    env = h.base_env(home, **extra)
    cluster = None
    try:
        h.role("bench.pickup_bench", env, "prepare", str(args.runs), str(home))
        cluster = h.qcluster("cluster", env, home / "logs")
        found = h.role("bench.pickup_bench", env, "measure", str(args.runs), str(home), str(args.wait))
        if not cluster.alive():
            raise SystemExit(f"the cluster exited:\n{cluster.tail()}")
    finally:
        if cluster is not None:
            cluster.stop()
        if backend == "postgres":
            h.drop_database(PG_DB)
        shutil.rmtree(home, ignore_errors=True)
    return {"backend": backend + (" + Redis" if redis else ""), **found}


def figures(values: list[float]) -> dict[str, float]:
    return {"p50": h.pct(values, 50), "p95": h.pct(values, 95), "max": max(values, default=float("nan"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="worker processes in the cluster")
    parser.add_argument("--backend", default="sqlite,postgres", help="sqlite, postgres or both (comma-separated)")
    parser.add_argument("--wait", type=float, default=45, help="seconds to wait for every pickup")
    parser.add_argument("--json", action="store_true", help="one JSON line per backend instead of the table")
    args = parser.parse_args([] if argv is None else argv)
    backends = [b for b in args.backend.split(",") if b and (b != "postgres" or h.pg_available())]
    if not args.json:
        print(f"\nPickup: {args.runs} runs started at once, 1 cluster × {args.workers} worker process(es)")
        print(f"{'':34}{'p50 s':>9}{'p95 s':>9}{'max s':>9}{'max ÷ baseline':>16}")
    for backend in backends:
        r = one_backend(args, backend)
        base, pick = figures(r["baseline"]), figures(r["pickup"])
        ratio = pick["max"] / base["max"] if base["max"] > 0 else float("nan")
        if args.json:
            print(json.dumps({"backend": r["backend"], "runs": args.runs, "baseline": base, "pickup": pick,
                              "ratio": ratio, "unclaimed": r["unclaimed"], "outcomes": r["outcomes"]}))  # fmt: skip
            continue
        print(f"== {r['backend']}")
        for label, f in ((f"{args.runs} no-op tasks run (baseline)", base), (f"{args.runs} runs claimed", pick)):
            print(f"  {label:32}{f['p50']:>9.2f}{f['p95']:>9.2f}{f['max']:>9.2f}", end="")
            print(f"{ratio:>15.1f}×" if f is pick else "")
        if r["unclaimed"]:
            print(f"  {r['unclaimed']} run(s) not claimed within {args.wait:g} s")
        print(f"  outcomes {r['outcomes']}")


ROLES = {
    "prepare": lambda a: prepare(int(a[0]), a[1]),
    "measure": lambda a: measure(int(a[0]), a[1], float(a[2])),
}

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--role":
        print(json.dumps(ROLES[sys.argv[2]](sys.argv[3:])))
    else:
        os.environ.pop("DJANGO_SETTINGS_MODULE", None)
        main(sys.argv[1:])
