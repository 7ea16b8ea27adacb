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

ITERATIONS = 30
# Statements per steady iteration (SQLite's BEGIN/COMMIT included), counted from the 5th
# iteration's row to the 25th's: what a long run pays again and again, without the opening (the
# workspace snapshot, the first lease slice) and the finish (receipt, review). It is one transaction: the run's fenced update (which begins the next iteration when
# nothing stands in its way), the events of both, the iteration's row, and the settle rolled into
# the next reservation on the run's own pool (lock, two reservations, one pool write, one insert of
# both entries). It was 18 in two transactions of 9 before the record began the next iteration.
# PostgreSQL sends no BEGIN but adds the ping that finds a connection cut while the act ran.
PINNED = {"sqlite": 10, "postgresql": 10}


def test_a_steady_iteration_sends_at_most_the_pinned_statements_and_never_locks_a_shared_pool(user, settings):
    from budgets.models import Pool

    settings.TETHER_BRAINS = {"instant": "bench.loop_bench.InstantBrain"}
    # The stored credentials redaction looks for are read again every few seconds, not per iteration:
    # on a slow machine that read must not fall inside the counted window.
    settings.TETHER_REDACTION_REFRESH_SECONDS = 3600
    statements, run = drive_counted(user, settings, "counted", ITERATIONS)
    shared = set(Pool.objects.exclude(kind="run").values_list("pk", flat=True))
    assert (run.outcome, run.iterations_done) == ("max_iterations", ITERATIONS)
    rows = [i for i, sql in enumerate(statements) if sql.startswith('INSERT INTO "loops_iteration"')]
    assert len(rows) == ITERATIONS
    steady = statements[rows[4] : rows[24]]
    per_iteration = len(steady) / 20
    shape = Counter(re.sub(r"\d+", "N", sql)[:90] for sql in steady)
    assert per_iteration <= PINNED[connection.vendor], f"{per_iteration:.1f} statements per iteration; most sent:\n" + "\n".join(
        f"{n:4} {sql}" for sql, n in shape.most_common(16)
    )
    shared_writes = [sql for sql in statements if sql.startswith('UPDATE "budgets_pool"') and pool_ids(sql) & shared]
    # the shared pools are written when the lease draws its one slice and when it returns, never per iteration
    assert len(shared_writes) == 2, shared_writes


def drive_counted(user, settings, name, iterations):
    """Drive a new run of `iterations` in this thread; return the statements it sent, and the run."""
    from instances.models import Instance
    from loops import leases, runner, services

    workspace = Path(settings.TETHER_WORKSPACES) / name
    instance = Instance.objects.create(
        owner=user, name=name, brain="instant", workspace=str(workspace), max_iterations=iterations
    )
    run = services.run_start(instance=instance, user=user, objective="count")
    lease = leases.claim(run.pk, 1, "test")
    with CaptureQueriesContext(connection) as queries:
        runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    return [q["sql"] for q in queries.captured_queries], run


def pool_ids(sql):
    found = re.search(r'WHERE "budgets_pool"\."id" (?:= (\d+)|IN \(([\d, ]+)\))', sql)
    return {int(pk) for pk in (found.group(1) or found.group(2)).split(",")} if found else set()
