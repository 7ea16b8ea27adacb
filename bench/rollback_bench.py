"""Rollback at workspace size: how long a person waits to see a rollback's confirmation and to roll back.

Not a test. In a throwaway SQLite database and TETHER_HOME: a workspace of `--files` files
(4 KB each, in 50 directories) is snapshot at a run's start; then a tenth of its files are
changed, a twentieth deleted and as many added, and the run is finished. Timed, each once:

- plan: what rolling back to `start` would change and leave (the confirmation; it snapshots the
  workspace as it is);
- rollback: the same, done (snapshot first, then every change written through the workspace
  held open);
- undo: rolling back to the point that rollback names (every change written back).

The snapshot's in-process cache of unchanged files is what makes the second and third quick;
a figure is seconds of wall clock on this machine, shared and noisy.

Run: python -m bench.rollback_bench [--files 5000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _harness as h


def measure(files: int, home: str) -> dict[str, Any]:
    h.migrated_backend("sqlite", home, "")
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from instances.models import Instance
    from loops import services
    from loops.models import Run
    from reviews import rollback, snapshots

    user = get_user_model().objects.create_user("rollback-bench")
    workspace = Path(home) / "workspaces" / "bench"
    instance = Instance.objects.create(owner=user, name="bench", command=["true"], workspace=str(workspace))
    for n in range(files):
        path = workspace / f"dir{n % 50}" / f"file{n}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(2048).hex().encode())
    run = services.run_start(instance=instance, user=user, objective="bench")
    snapshots.take(run)
    for n in range(0, files, 10):
        (workspace / f"dir{n % 50}" / f"file{n}.txt").write_text("changed\n")
    for n in range(5, files, 20):
        (workspace / f"dir{n % 50}" / f"file{n}.txt").unlink()
    for n in range(files // 20):
        (workspace / "added" / f"new{n}.txt").parent.mkdir(exist_ok=True)
        (workspace / "added" / f"new{n}.txt").write_text(f"new {n}\n")
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FINISHED, outcome="cancelled", finished_at=timezone.now()
    )
    run.refresh_from_db()

    figures: dict[str, Any] = {"files": files}
    started = time.perf_counter()
    plan = rollback.plan(run=run, to="start")
    figures["plan_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    done = rollback.rollback(run=run, user=user, to="start", via="cli")
    figures["rollback_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    undone = rollback.rollback(run=run, user=user, to=done.undo, via="cli")
    figures["undo_s"] = round(time.perf_counter() - started, 3)
    figures["changes"] = len(plan.added) + len(plan.modified) + len(plan.deleted)
    figures["exact"] = bool(done.exact and undone.exact)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="tether-rollback-bench-")
    try:
        figures = measure(args.files, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{figures['files']:,} files, {figures['changes']:,} changes (exact both ways: {figures['exact']})")
    for key, name in (("plan_s", "plan (the confirmation)"), ("rollback_s", "rollback"), ("undo_s", "undo")):
        print(f"  {name:<26} {figures[key]:>7.3f} s")


if __name__ == "__main__":
    main()
