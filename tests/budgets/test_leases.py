"""Quota leases: a run's calls lock its run pool alone, the shared pools see slices, and nothing is over-admitted.

A run pool draws slices of its ancestors' headroom (`TETHER_BUDGET_LEASE_USD`, at most a
quarter of what the tightest ancestor has left, or just what is missing); its reservations
hold money in it alone; the lease returns, booked at what the run took, when the run
finishes, parks or is deleted, and at once when a settle goes beyond it.
"""

import pytest

from budgets import ledger, limits, selectors, services
from budgets.booking import BudgetRefused
from budgets.models import LedgerEntry, Pool, Reservation

pytestmark = pytest.mark.django_db

CENT = 10_000


def opened(make_run, **fields):
    run = make_run(**fields)
    return run, services.open_run_pools(run)


def ancestors_of(pool):
    return list(Pool.objects.filter(pk__in=pool.chain_ids()[:-1]).order_by("path"))


def test_every_run_has_a_leased_pool_of_its_own(make_run):
    run, pool = opened(make_run)
    assert (pool.kind, pool.run, pool.limit, pool.quota, pool.quota_used) == ("run", run, None, 0, 0)
    assert [p.kind for p in selectors.run_chain(run)] == ["root", "user", "instance", "run"]


def test_after_the_first_slice_a_runs_calls_never_touch_the_shared_pools(make_run):
    run, pool = opened(make_run, max_cost_micros=1_000_000)
    first = ledger.hold(run=run, iteration=1, call=1, amount=2 * CENT).pk
    ledger.settle(first, actual=CENT)
    shared = [p.pk for p in ancestors_of(pool)]
    entries = LedgerEntry.objects.filter(pool__in=shared).count()
    assert entries == 3  # one slice, drawn once: a reserve entry on root, user and instance
    for call in range(2, 22):
        held = ledger.hold(run=run, iteration=1, call=call, amount=CENT).pk
        assert Reservation.objects.get(pk=held).chain == [pool.pk]  # held in the run pool alone
        ledger.settle(held, actual=CENT // 2)
    assert LedgerEntry.objects.filter(pool__in=shared).count() == entries
    pool.refresh_from_db()
    assert (pool.spent, pool.reserved, pool.quota) == (CENT + 20 * CENT // 2, 0, 250_000)
    assert selectors.audit_pools() == []


def test_a_slice_is_at_most_a_quarter_of_what_the_tightest_ancestor_has_left(make_run):
    run, pool = opened(make_run)
    limits.set_limit(services.user_pool(run.owner), 40 * CENT, "admin")
    ledger.hold(run=run, iteration=1, call=1, amount=CENT)
    pool.refresh_from_db()
    assert pool.quota == 10 * CENT  # a quarter of $0.40, not the $0.25 default
    # a call bigger than that draws just what the lease is short of
    ledger.hold(run=run, iteration=1, call=2, amount=20 * CENT)
    pool.refresh_from_db()
    assert (pool.quota, pool.quota_used) == (10 * CENT + 11 * CENT, 21 * CENT)


def test_a_lease_never_lets_two_runs_spend_past_the_pool_they_share(make_run, make_instance, user):
    instance = make_instance(user)
    runs = [opened(make_run, instance=instance)[0] for _ in range(2)]
    user_pool = services.user_pool(user)
    limits.set_limit(user_pool, 30 * CENT, "admin")
    spent = {run.pk: 0 for run in runs}
    refused = 0
    for n in range(200):
        run = runs[n % 2]
        try:
            held = ledger.hold(run=run, iteration=n + 1, call=1, amount=CENT).pk
        except BudgetRefused:
            refused += 1
            continue
        user_pool.refresh_from_db()
        assert user_pool.spent + user_pool.reserved <= user_pool.limit
        ledger.settle(held, actual=CENT)
        spent[run.pk] += CENT
    assert refused and sum(spent.values()) <= 30 * CENT
    for run in runs:
        ledger.return_run_lease(run.pk)
    user_pool.refresh_from_db()
    assert user_pool.spent == sum(spent.values()) and user_pool.reserved == 0
    assert selectors.audit_pools() == []


def test_alone_on_a_small_budget_a_run_spends_all_of_it(make_run):
    # The slices shrink as the headroom does, and the last ones are exactly what is missing.
    run, pool = opened(make_run)
    limits.set_limit(services.user_pool(run.owner), 30 * CENT, "admin")
    total = 0
    for n in range(1, 100):
        try:
            held = ledger.hold(run=run, iteration=n, amount=CENT).pk
        except BudgetRefused as refused:
            assert refused.pool_name.startswith("user ")
            break
        ledger.settle(held, actual=CENT)
        total += CENT
    assert total == 30 * CENT


def test_the_runs_headroom_counts_its_unused_lease(make_run):
    run, pool = opened(make_run)
    limits.set_limit(services.user_pool(run.owner), 30 * CENT, "admin")
    ledger.settle(ledger.hold(run=run, iteration=1, amount=CENT).pk, actual=CENT)
    headroom = selectors.headroom_for_run(run)
    assert headroom.remaining == 29 * CENT  # what an exact chain would say: $0.30 less the $0.01 spent
    assert headroom.limiting.kind == "user"


def test_a_finished_run_returns_its_lease_and_the_chain_books_what_it_spent(make_run):
    run, pool = opened(make_run, max_cost_micros=1_000_000)
    ledger.settle(ledger.hold(run=run, iteration=1, amount=5 * CENT).pk, actual=3 * CENT)
    held = ledger.hold(run=run, iteration=2, amount=2 * CENT).pk  # still out when the lease returns
    assert ledger.return_run_lease(run.pk) == 3 * CENT  # what it spent; what is held stays leased
    assert ledger.return_run_lease(run.pk) == 0
    for shared in ancestors_of(pool):
        assert (shared.spent, shared.reserved) == (3 * CENT, 2 * CENT), shared.name
    ledger.settle(held, actual=CENT)  # the last held settles: the rest of the lease goes back
    for shared in ancestors_of(pool):
        assert (shared.spent, shared.reserved) == (4 * CENT, 0), shared.name
    pool.refresh_from_db()
    assert (pool.spent, pool.reserved, pool.quota, pool.quota_used, pool.lease_ending) == (4 * CENT, 0, 0, 0, False)
    assert not Reservation.objects.filter(status="held").exists()
    assert selectors.audit_pools() == []


def test_a_parent_stopped_before_its_child_is_charged_only_what_the_child_spent(make_run):
    from loops.models import Run

    parent, parent_pool = opened(make_run, max_cost_micros=1_000_000)
    limits.set_limit(services.user_pool(parent.owner), 10_000_000, "admin")
    child = Run.objects.create(
        instance=parent.instance, owner=parent.owner, objective="child", max_iterations=5,
        parent=parent, depth=1, max_cost_micros=50 * CENT,
    )
    child_pool = services.open_run_pools(child)
    ledger.settle(ledger.hold(run=child, iteration=1, amount=5 * CENT).pk, actual=CENT)
    assert ledger.return_run_lease(parent.pk) == 0  # the parent finishes first: its child's carve is still out
    ledger.refund_carve(child_pool)  # then the child: the rest of the parent's lease goes back
    for shared in ancestors_of(parent_pool):
        assert (shared.spent, shared.reserved) == (CENT, 0), shared.name
    assert not Reservation.objects.filter(status="held").exists()
    assert selectors.audit_pools() == []


def test_a_reported_overdraft_reaches_every_ancestor_at_once_and_blocks_them(make_run, make_instance, user):
    run, pool = opened(make_run)
    sibling, _ = opened(make_run, instance=make_instance(user, name="sibling"))
    user_pool = services.user_pool(user)
    limits.set_limit(user_pool, 100 * CENT, "admin")
    held = ledger.hold(run=run, iteration=1, amount=5 * CENT).pk
    ledger.settle(held, actual=50_000_000)  # an agent reported $50 against $0.05
    user_pool.refresh_from_db()
    # booked up the chain now: the excess over the lease as spent, the lease itself still held
    assert user_pool.spent + user_pool.reserved == 50_000_000 and user_pool.spent > user_pool.limit
    assert LedgerEntry.objects.filter(pool=user_pool, kind="overdraft").exists()
    with pytest.raises(BudgetRefused, match="overdrawn"):
        ledger.hold(run=sibling, iteration=1, amount=1)
    assert selectors.audit_pools() == []


def test_an_overdraft_with_another_call_still_held_is_booked_once_and_never_looks_like_a_grant(make_run):
    from django.db.models import F

    run, pool = opened(make_run)
    user_pool = services.user_pool(run.owner)
    limits.set_limit(user_pool, 100 * CENT, "admin")
    first = ledger.hold(run=run, iteration=1, call=1, amount=CENT).pk
    second = ledger.hold(run=run, iteration=1, call=2, amount=CENT).pk
    ledger.settle(first, actual=5_000_000)
    ledger.settle(second, actual=1)
    past_a_limit = LedgerEntry.objects.filter(
        kind="reserve", limit_after__isnull=False, limit_after__lt=F("spent_after") + F("reserved_after")
    )
    assert not past_a_limit.exists()
    ledger.return_run_lease(run.pk)
    user_pool.refresh_from_db()
    assert (user_pool.spent, user_pool.reserved) == (5_000_001, 0)
    assert selectors.audit_pools() == []


def test_a_deleted_run_gives_its_lease_back(make_run):
    run, pool = opened(make_run)
    ledger.settle(ledger.hold(run=run, iteration=1, amount=2 * CENT).pk, actual=CENT)
    ancestors = ancestors_of(pool)
    run.delete()
    for shared in ancestors:
        shared.refresh_from_db()
        assert (shared.spent, shared.reserved) == (CENT, 0), shared.name


def test_a_childs_carve_draws_on_its_parents_lease(make_run):
    from loops.models import Run

    parent, parent_pool = opened(make_run, max_cost_micros=1_000_000)
    child = Run.objects.create(
        instance=parent.instance, owner=parent.owner, objective="child", max_iterations=5,
        parent=parent, depth=1, max_cost_micros=20 * CENT,
    )
    child_pool = services.open_run_pools(child)
    carve = Reservation.objects.get(carved=child_pool)
    assert carve.chain == [parent_pool.pk] and carve.on_lease_id == parent_pool.pk
    assert child_pool.quota is None  # set aside already: the child needs no lease
    ledger.settle(ledger.hold(run=child, iteration=1, amount=5 * CENT).pk, actual=4 * CENT)
    assert ledger.refund_carve(child_pool) == 4 * CENT
    assert ledger.return_run_lease(parent.pk) == 4 * CENT
    for shared in ancestors_of(parent_pool):
        assert (shared.spent, shared.reserved) == (4 * CENT, 0), shared.name


def test_with_leases_off_every_reservation_holds_money_in_the_whole_chain(make_run, settings):
    settings.TETHER_BUDGET_LEASE_USD = "0"
    run, pool = opened(make_run)
    assert pool.quota is None
    held = ledger.hold(run=run, iteration=1, amount=CENT).pk
    assert Reservation.objects.get(pk=held).chain == pool.chain_ids()
    assert all(p.reserved == CENT for p in selectors.run_chain(run))


def test_a_leased_reserve_is_idempotent_per_key_and_its_held_settle_is_not_read_first(make_run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run, pool = opened(make_run, max_cost_micros=1_000_000)
    first = ledger.hold(run=run, iteration=3, call=1, amount=2 * CENT)
    again = ledger.hold(run=run, iteration=3, call=1, amount=2 * CENT)  # a retry after a cut, say
    assert again == first and Reservation.objects.filter(run_id=run.pk, status="held").count() == 1
    pool.refresh_from_db()
    assert pool.reserved == 2 * CENT  # held once
    with CaptureQueriesContext(connection) as seen:
        ledger.settle(first, actual=CENT, usage={"input_tokens": 7, "output_tokens": 3})
    assert not [q["sql"] for q in seen.captured_queries if q["sql"].startswith('SELECT "budgets_reservation"')]
    settled = Reservation.objects.get(pk=first.pk)
    assert (settled.status, settled.actual, settled.usage) == ("settled", CENT, {"input_tokens": 7, "output_tokens": 3})
    assert ledger.settle(first, actual=5 * CENT) == []  # closed already: the guarded write finds it so
    pool.refresh_from_db()
    assert (pool.spent, pool.reserved) == (CENT, 0)
    assert selectors.audit_pools() == []


def test_a_held_settle_of_a_reservation_the_reaper_closed_meanwhile_changes_nothing(make_run):
    run, pool = opened(make_run, max_cost_micros=1_000_000)
    held = ledger.hold(run=run, iteration=1, call=1, amount=2 * CENT)
    assert ledger.close_abandoned(run) == 2 * CENT
    assert ledger.settle(held, actual=CENT) == []
    pool.refresh_from_db()
    assert (pool.spent, pool.reserved) == (2 * CENT, 0)  # the reaper's conservative settle stands
    assert Reservation.objects.get(pk=held.pk).status == "abandoned"
    assert selectors.audit_pools() == []


def test_a_lease_returned_past_an_overdraft_keeps_what_is_held_on_its_slice_and_grants_nothing(make_run):
    # The run parks with a call still out after an overdraft took its ancestors past their limit:
    # what is still held stays on the slice that holds it — never a new reserve on an overdrawn pool.
    from django.db.models import F

    run, pool = opened(make_run)
    user_pool = services.user_pool(run.owner)
    limits.set_limit(user_pool, 100 * CENT, "admin")
    still_out = ledger.hold(run=run, iteration=1, call=1, amount=2 * CENT).pk
    (slice_,) = Reservation.objects.filter(lease_for=pool, status="held")
    ledger.settle(ledger.hold(run=run, iteration=1, call=2, amount=CENT).pk, actual=5_000_000)
    last = LedgerEntry.objects.order_by("-pk").values_list("pk", flat=True).first()
    assert ledger.return_run_lease(run.pk) == 25 * CENT - 2 * CENT  # the rest of the slice, spent
    assert not LedgerEntry.objects.filter(pk__gt=last, kind="reserve").exists()  # nothing granted anew
    past_a_limit = LedgerEntry.objects.filter(
        kind="reserve", limit_after__isnull=False, limit_after__lt=F("spent_after") + F("reserved_after")
    )
    assert not past_a_limit.exists()
    held = Reservation.objects.filter(lease_for=pool, status="held")
    assert [(r.pk, r.amount) for r in held] == [(slice_.pk, 2 * CENT)]  # kept on its slice, exactly
    user_pool.refresh_from_db()
    pool.refresh_from_db()
    assert (user_pool.spent, user_pool.reserved) == (5_000_000, 2 * CENT)
    assert (pool.quota, pool.quota_used, pool.lease_ending) == (2 * CENT, 2 * CENT, True)
    assert selectors.audit_pools() == []
    ledger.settle(still_out, actual=CENT)  # the last held settles: the rest goes back
    for shared in ancestors_of(pool):
        assert (shared.spent, shared.reserved) == (5_010_000, 0), shared.name
    pool.refresh_from_db()
    assert (pool.quota, pool.quota_used, pool.lease_ending) == (0, 0, False)
    assert not Reservation.objects.filter(status="held").exists()
    assert selectors.audit_pools() == []
