"""The iteration's cost in statements, pinned: a change that makes every iteration talk to the database more fails here.

The loop is driven in this thread (the driver's connection is the test's), with an act that
returns at once (`bench.loop_bench.InstantBrain`, the benchmark's own), so what is counted is
Tether's bookkeeping alone. With quota leases, the run's reservations after the first slice
touch its run pool only: the shared root, user and instance rows are not in a steady iteration.
"""

import re
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db(transaction=True)

ITERATIONS = 20
# Statements per iteration (SQLite's BEGIN/COMMIT included), measured: 20.7 on SQLite (25.8 before
# the run's update carried its events' sequence, a settle stopped re-reading its reservation and
# the reserve's key check and the waiting messages came with the locks' reads). A steady
# iteration is two transactions of 9; the aim is 10 in all, and this pin keeps it from growing.
# PostgreSQL's 21.7 adds the ping that finds a connection cut while the act ran (a file cannot be cut).
PINNED = {"sqlite": 21, "postgresql": 22}


def test_a_steady_iteration_sends_at_most_the_pinned_statements_and_never_locks_a_shared_pool(user, settings):
    from budgets.models import Pool
    from instances.models import Instance
    from loops import runner, services

    settings.TETHER_BRAINS = {"instant": "bench.loop_bench.InstantBrain"}
    workspace = Path(settings.TETHER_WORKSPACES) / "statements"
    instance = Instance.objects.create(
        owner=user, name="counted", brain="instant", workspace=str(workspace), max_iterations=ITERATIONS
    )
    run = services.run_start(instance=instance, user=user, objective="count")
    lease = runner.claim(run.pk, 1, "test")
    shared = set(Pool.objects.exclude(kind="run").values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    assert (run.outcome, run.iterations_done) == ("max_iterations", ITERATIONS)
    statements = [q["sql"] for q in queries.captured_queries]
    # The first iteration opens the run (its workspace snapshot, its first lease slice) and the
    # last one finishes it; the ones between are what a long run pays again and again.
    per_iteration = len(statements) / ITERATIONS
    shape = Counter(re.sub(r"\d+", "N", sql)[:90] for sql in statements)
    assert per_iteration <= PINNED[connection.vendor], f"{per_iteration:.1f} statements per iteration; most sent:\n" + "\n".join(
        f"{n:4} {sql}" for sql, n in shape.most_common(12)
    )
    shared_writes = [sql for sql in statements if sql.startswith('UPDATE "budgets_pool"') and pool_ids(sql) & shared]
    # the shared pools are written when the lease draws its one slice and when it returns, never per iteration
    assert len(shared_writes) == 2, shared_writes


def pool_ids(sql):
    found = re.search(r'WHERE "budgets_pool"\."id" (?:= (\d+)|IN \(([\d, ]+)\))', sql)
    return {int(pk) for pk in (found.group(1) or found.group(2)).split(",")} if found else set()
