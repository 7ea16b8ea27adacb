"""Rolling an iteration's settle into the next one's reservation (`ledger.roll`).

A steady iteration's record settles its reservation and holds the next one's in one transaction.
`roll` must move exactly the money a `settle` followed by a `hold` would, entry for entry, in
every case — and in the steady one, where the run's lease covers both, in five statements.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from budgets import booking, ledger, selectors, services
from budgets.models import LedgerEntry, Pool, Reservation

pytestmark = pytest.mark.django_db

CENT = 10_000

# limit of the run's pool, the first hold, what it cost, the next hold, the pool's threshold (%)
CASES = {
    "steady": (100 * CENT, 5 * CENT, CENT // 2, 5 * CENT, None),
    "an overdraft": (100 * CENT, 5 * CENT, 7 * CENT, 5 * CENT, None),
    "a lease too short for the next hold": (100 * CENT, 5 * CENT, CENT, 30 * CENT, None),
    "a threshold crossed": (30 * CENT, 20 * CENT, 20 * CENT, 2 * CENT, 50),
    "a refusal": (10 * CENT, 5 * CENT, 5 * CENT, 6 * CENT, None),
}


def started(make_run, limit, first, threshold):
    run = make_run(max_cost_micros=limit)
    pool = services.open_run_pools(run)
    if threshold is not None:
        Pool.objects.filter(pk=pool.pk).update(threshold_percent=threshold)
    return run, pool, ledger.hold(run=run, iteration=1, amount=first)


def booked(pool):
    """What the run's pool holds and says, without ids or times."""
    pool.refresh_from_db()
    entries = LedgerEntry.objects.filter(pool=pool).order_by("pk")
    return (
        (pool.spent, pool.reserved, pool.quota, pool.quota_used, pool.lease_ending, pool.threshold_flagged_at is None),
        [(e.kind, e.amount, e.spent_delta, e.reserved_delta, e.spent_after, e.reserved_after, e.iteration) for e in entries],
        sorted(Reservation.objects.filter(run_id=pool.run_id).values_list("iteration", "status", "amount", "actual")),
    )


@pytest.mark.parametrize("case", CASES)
def test_a_roll_moves_the_money_a_settle_and_a_hold_would(make_run, case):
    limit, first, actual, amount, threshold = CASES[case]
    rolled_run, rolled_pool, rolled = started(make_run, limit, first, threshold)
    twin_run, twin_pool, twin = started(make_run, limit, first, threshold)

    def both(run, step):
        try:
            return step(), None
        except booking.BudgetRefused as refused:
            return None, refused.detail.replace(f"run {run.pk}", "run R")

    got, refused = both(rolled_run, lambda: ledger.roll(rolled, actual=actual, run=rolled_run, iteration=2, amount=amount))
    ledger.settle(twin, actual=actual)
    want, twin_refused = both(twin_run, lambda: ledger.hold(run=twin_run, iteration=2, amount=amount))

    assert booked(rolled_pool) == booked(twin_pool)
    assert refused == twin_refused
    assert (got is None) == (want is None)
    if got is not None:
        assert got == ledger.Held(got.pk, want.chain[:-1] + [rolled_pool.pk], amount, rolled_run.pk, 2, got.on_lease_id)
    assert selectors.audit_pools() == []


def test_a_steady_roll_is_five_statements_on_the_runs_own_pool(make_run):
    run, pool, held = started(make_run, 100 * CENT, 5 * CENT, None)
    shared = set(Pool.objects.exclude(pk=pool.pk).values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        ledger.roll(held, actual=CENT, run=run, iteration=2, amount=5 * CENT)
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 5, "\n".join(statements)  # lock, settle, reserve, one pool write, one entries insert
    assert not [sql for sql in statements if sql.startswith('UPDATE "budgets_pool"') and any(
        f'"id" = {pk}' in sql or f" {pk})" in sql for pk in shared
    )]


def test_a_roll_after_a_stop_closed_the_reservation_holds_the_next_one_only(make_run):
    run, pool, held = started(make_run, 100 * CENT, 5 * CENT, None)
    ledger.settle(held, actual=2 * CENT)  # closed by a stop that judged the driver dead
    rolled = ledger.roll(held, actual=CENT, run=run, iteration=2, amount=5 * CENT)
    pool.refresh_from_db()
    assert (pool.spent, pool.reserved) == (2 * CENT, 5 * CENT)  # its first settle stands; nothing settled twice
    assert Reservation.objects.get(pk=rolled.pk).status == Reservation.Status.HELD
    assert selectors.audit_pools() == []
