"""Many OS processes reserve against one shared root pool at once: the limit holds and the books balance.

Each worker is a spawned process with its own connection to the test database
(`bench.ledger_bench.hammer`, the benchmark's worker). Deadlocks, serialization failures and
busy-database errors are retried whole by `retry.atomic_with_retry`, never lost.
"""

import pytest
from django.db import connection
from django.db.models import F

from bench.ledger_bench import Job, child_env, run_workers
from budgets import selectors, services
from budgets.models import LedgerEntry, Pool, Reservation

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Amounts are 1..1000 micro-dollars; a settled reservation costs about half its amount, so these
# limits run out part-way through and the later reservations meet a full pool.
MAX_AMOUNT = 1000


def hammer_one_root(django_user_model, *, processes, per_process, root_limit):
    users = [django_user_model.objects.create_user(f"hammer-{n}") for n in range(2)]
    from instances.models import Instance
    from loops.models import Run

    runs = []
    for n in range(processes):
        instance = Instance.objects.create(owner=users[n % 2], name=f"hammer-{n}", command=["true"])
        cap = None if n % 4 == 0 else 10**9  # most runs get a run pool too: chains of 3 and 4 pools
        run = Run.objects.create(
            instance=instance, owner=instance.owner, objective="o", max_iterations=10**6, max_cost_micros=cap
        )
        services.open_run_pools(run)
        runs.append(run)
    root = services.root_pool()
    from budgets import ledger, limits

    limits.set_limit(root, root_limit, "test")
    watched = [root.pk, *Pool.objects.filter(kind="user").values_list("pk", flat=True)]
    jobs = [
        Job(
            env=child_env(connection),
            run_id=run.pk,
            first_iteration=1,
            count=per_process,
            seed=n,
            max_amount=MAX_AMOUNT,
            settle_now=0.8,
            check_pool_ids=watched,
        )
        for n, run in enumerate(runs)
    ]
    results = run_workers(jobs, timeout=300)

    requested = processes * per_process
    granted = sum(r.granted for r in results)
    refused = sum(r.refused for r in results)
    assert granted + refused == requested
    assert [v for r in results for v in r.violations] == []
    # nothing lost, nothing doubled: one reservation row per grant, each held or settled once
    # (besides the lease slices the run pools drew from their ancestors)
    calls = Reservation.objects.filter(lease_for=None)
    assert calls.count() == granted
    held = {pk for r in results for pk in r.held}
    assert set(calls.filter(status="held").values_list("pk", flat=True)) == held
    assert calls.filter(status="settled").count() == granted - len(held)
    assert sum(r.settled for r in results) == granted - len(held)
    assert selectors.audit_pools() == []
    root.refresh_from_db()
    assert root.spent + root.reserved <= root.limit
    # the invariant at every moment a reservation was granted, from the ledger's own snapshots
    over = LedgerEntry.objects.filter(
        kind="reserve", limit_after__isnull=False, limit_after__lt=F("spent_after") + F("reserved_after")
    )
    assert not over.exists()
    assert granted > 0 and refused > 0, (granted, refused)
    # the runs finish: their leases return, and the root's spend is exact (what is still held counts)
    for run in runs:
        ledger.return_run_lease(run.pk)
    root.refresh_from_db()
    settled = sum(calls.filter(status="settled").values_list("actual", flat=True))
    still_held = sum(calls.filter(status="held").values_list("amount", flat=True))
    assert (root.spent, root.reserved) == (settled, still_held)  # what is held stays leased, exactly
    assert selectors.audit_pools() == []
    return results


def test_sqlite_many_processes_share_one_root_pool(django_user_model):
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite-sized run; PostgreSQL runs the full one")
    hammer_one_root(django_user_model, processes=4, per_process=50, root_limit=30_000)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the full-size hammer needs PostgreSQL")
def test_postgresql_16_processes_10000_reservations_on_one_root_pool(django_user_model):
    results = hammer_one_root(django_user_model, processes=16, per_process=625, root_limit=300_000)
    granted = sum(r.granted for r in results)
    wall = max(r.end for r in results) - min(r.start for r in results)
    print(
        f"granted {granted}, refused {10_000 - granted}, retries {sum(r.retries for r in results)}, {wall:.1f}s"
    )
