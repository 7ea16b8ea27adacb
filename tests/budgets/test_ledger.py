"""The ledger, pools and prices against the database: one behaviour per test.

These pin the chain's rules with quota leases off (`TETHER_BUDGET_LEASE_USD=0`: every
reservation holds money in its whole chain at once); `test_leases.py` pins leases.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import override_settings

from budgets import booking, ledger, limits, selectors, services
from budgets.booking import BudgetRefused, InvalidBudget
from budgets.models import LedgerEntry, Pool, Price, Reservation
from budgets.signals import threshold_crossed
from instances.brains.base import Usage

pytestmark = pytest.mark.django_db

DAY1 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def exact_chains(settings):
    settings.TETHER_BUDGET_LEASE_USD = "0"


def chain(run):
    return selectors.run_chain(run)


def books_are_sound(*pools):
    problems = [p for pool in pools for p in selectors.audit_pool(pool)]
    assert problems == []


def refresh(*pools):
    for pool in pools:
        pool.refresh_from_db()


# --- the pool tree ---------------------------------------------------------------------


def test_open_run_pools_builds_root_user_instance_and_a_run_pool_for_a_cap(make_run, user):
    run = make_run(max_cost_micros=2_000_000)
    leaf = services.open_run_pools(run)
    pools = chain(run)
    assert [p.kind for p in pools] == ["root", "user", "instance", "run"]
    assert pools[0].name == "organisation" and pools[1].owner == user and pools[2].instance == run.instance
    assert leaf == pools[3] and leaf.limit == 2_000_000 and leaf.run == run
    assert services.open_run_pools(run) == leaf
    assert Pool.objects.count() == 4
    # the cap is the run pool's first limit change, in the ledger
    assert LedgerEntry.objects.filter(pool=leaf, kind="limit").count() == 1


def test_a_run_without_a_cap_has_an_unlimited_pool_of_its_own(make_run):
    run = make_run()
    leaf = services.open_run_pools(run)
    assert (leaf.kind, leaf.limit, leaf.run) == ("run", None, run)
    assert [p.kind for p in chain(run)] == ["root", "user", "instance", "run"]


def test_runs_of_one_instance_share_its_pool_each_with_its_own(make_run, make_instance, user):
    instance = make_instance(user)
    first, second = make_run(instance), make_run(instance)
    one, two = services.open_run_pools(first), services.open_run_pools(second)
    assert one != two and one.parent_id == two.parent_id == services.instance_pool(instance).pk


def test_a_run_cap_larger_than_the_remaining_headroom_is_refused_and_nothing_changes(make_run):
    run = make_run(max_cost_micros=5_000_000)
    instance_pool = services.instance_pool(run.instance)
    limits.set_limit(instance_pool, 3_000_000, "admin")
    before = Pool.objects.count()
    with pytest.raises(InvalidBudget, match=r"more than pool .*\$3\.00"):
        services.open_run_pools(run)
    assert Pool.objects.count() == before


@pytest.mark.parametrize("cap", [-1, "5", 1.5])
def test_a_bad_run_cap_is_refused(make_run, cap):
    run = make_run()
    run.max_cost_micros = cap
    with pytest.raises(InvalidBudget):
        services.open_run_pools(run)
    assert not Pool.objects.filter(kind="run").exists()


def test_reserve_opens_missing_pools(make_run):
    run = make_run(max_cost_micros=1_000_000)
    assert ledger.hold(run=run, iteration=1, amount=10).pk is not None
    assert [p.kind for p in chain(run)] == ["root", "user", "instance", "run"]


def test_a_pool_cannot_become_its_own_ancestor(make_run):
    run = make_run(max_cost_micros=100)
    services.open_run_pools(run)
    root, _, instance_pool, run_pool = chain(run)
    root.parent = run_pool
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        root.clean()


# --- reserve ------------------------------------------------------------------------------


def test_reserve_holds_the_amount_in_every_pool_of_the_chain(make_run):
    run = make_run(max_cost_micros=1_000_000)
    reservation = ledger.hold(run=run, iteration=1, amount=250_000).pk
    held = Reservation.objects.get(pk=reservation)
    assert held.status == "held" and held.amount == 250_000 and held.run_id == run.pk
    pools = chain(run)
    assert [p.reserved for p in pools] == [250_000] * 4
    assert held.chain == sorted(p.pk for p in pools)
    assert LedgerEntry.objects.filter(reservation=held, kind="reserve").count() == 4
    books_are_sound(*pools)


def test_reserve_is_idempotent_per_run_and_iteration(make_run):
    run = make_run()
    first = ledger.hold(run=run, iteration=3, amount=100).pk
    assert ledger.hold(run=run, iteration=3, amount=999).pk == first
    assert Reservation.objects.count() == 1
    assert chain(run)[0].reserved == 100


def test_reserve_refuses_naming_the_pool_and_the_numbers_and_changes_nothing(make_run):
    run = make_run()
    instance_pool = services.instance_pool(run.instance)
    limits.set_limit(instance_pool, 100_000, "admin")
    ledger.hold(run=run, iteration=1, amount=60_000)
    entries = LedgerEntry.objects.count()
    with pytest.raises(BudgetRefused) as refused:
        ledger.hold(run=run, iteration=2, amount=50_000)
    assert refused.value.pool_name == instance_pool.name
    assert refused.value.pool_id == instance_pool.pk
    detail = refused.value.detail
    assert (
        instance_pool.name in detail
        and "$0.04 left" in detail
        and "$0.10 limit" in detail
        and "$0.05" in detail
    )
    assert Reservation.objects.count() == 1 and LedgerEntry.objects.count() == entries


def test_a_refusal_names_the_innermost_pool_that_refuses(make_run):
    run = make_run(max_cost_micros=100)
    services.open_run_pools(run)
    limits.set_limit(services.root_pool(), 50, "admin")
    with pytest.raises(BudgetRefused) as refused:
        ledger.hold(run=run, iteration=1, amount=200)
    assert refused.value.pool_name == f"run {run.pk}"


def test_a_refusal_inside_the_callers_transaction_leaves_it_usable(make_run):
    run = make_run(max_cost_micros=10)
    with transaction.atomic():
        with pytest.raises(BudgetRefused):
            ledger.hold(run=run, iteration=1, amount=11)
        run.outcome_detail = "budget exhausted"
        run.save(update_fields=["outcome_detail"])
    run.refresh_from_db()
    assert run.outcome_detail == "budget exhausted"


def test_a_limit_of_exactly_the_amount_grants(make_run):
    run = make_run(max_cost_micros=500)
    assert ledger.hold(run=run, iteration=1, amount=500).pk
    with pytest.raises(BudgetRefused):
        ledger.hold(run=run, iteration=2, amount=1)


@pytest.mark.parametrize("amount", [-1, 1.5, "10", None, True])
def test_reserve_refuses_a_bad_amount(make_run, amount):
    with pytest.raises(ValueError):
        ledger.hold(run=make_run(), iteration=1, amount=amount)


# --- settle, release, overdraft, abandoned -----------------------------------------------------


def test_settle_moves_the_actual_cost_to_spent_and_refunds_the_rest(make_run):
    run = make_run(max_cost_micros=1_000_000)
    reservation = ledger.hold(run=run, iteration=1, amount=300_000).pk
    assert ledger.settle(reservation, actual=120_000) == []
    pools = chain(run)
    assert [(p.spent, p.reserved) for p in pools] == [(120_000, 0)] * 4
    settled = Reservation.objects.get(pk=reservation)
    assert (settled.status, settled.actual, settled.overdraft) == ("settled", 120_000, 0)
    books_are_sound(*pools)


def test_settle_is_idempotent(make_run):
    run = make_run()
    reservation = ledger.hold(run=run, iteration=1, amount=300).pk
    ledger.settle(reservation, actual=100)
    ledger.settle(reservation, actual=250)
    ledger.settle(None, actual=5)
    assert chain(run)[0].spent == 100
    assert LedgerEntry.objects.filter(kind="settle").count() == 4  # one per pool, once


def test_release_gives_everything_back(make_run):
    run = make_run()
    reservation = ledger.hold(run=run, iteration=1, amount=300).pk
    ledger.release(reservation)
    ledger.release(reservation)
    assert [(p.spent, p.reserved) for p in chain(run)] == [(0, 0)] * 4
    assert Reservation.objects.get(pk=reservation).status == "released"
    books_are_sound(*chain(run))


def test_an_overdraft_is_recorded_and_blocks_the_chain_until_covered(make_run):
    run = make_run()
    instance_pool = services.instance_pool(run.instance)
    limits.set_limit(instance_pool, 100, "admin")
    reservation = ledger.hold(run=run, iteration=1, amount=60).pk
    ledger.settle(reservation, actual=150)
    instance_pool.refresh_from_db()
    assert instance_pool.spent == 150 > instance_pool.limit
    assert Reservation.objects.get(pk=reservation).overdraft == 90
    overdraft = LedgerEntry.objects.get(pool=instance_pool, kind="overdraft")
    assert overdraft.amount == 50
    with pytest.raises(BudgetRefused, match="overdrawn"):
        ledger.hold(run=run, iteration=2, amount=0)
    limits.top_up(instance_pool, 100, "admin")  # limit 200, spent 150
    assert ledger.hold(run=run, iteration=2, amount=50).pk
    with pytest.raises(BudgetRefused, match=r"\$0\.00 left"):
        ledger.hold(run=run, iteration=3, amount=1)
    books_are_sound(*chain(run))


def test_close_abandoned_settles_held_reservations_at_their_full_amount(make_run):
    run = make_run(max_cost_micros=10_000)
    first = ledger.hold(run=run, iteration=1, amount=1_000).pk
    ledger.settle(first, actual=200)
    second = ledger.hold(run=run, iteration=2, amount=3_000).pk
    assert ledger.close_abandoned(run) == 3_000
    assert ledger.close_abandoned(run) == 0
    closed = Reservation.objects.get(pk=second)
    assert (closed.status, closed.actual) == ("abandoned", 3_000)
    entry = LedgerEntry.objects.filter(reservation=closed, kind="abandoned").first()
    assert entry.actor_label == "reaper" and "conservative" in entry.note
    assert [(p.spent, p.reserved) for p in chain(run)] == [(3_200, 0)] * 4
    # the re-driven iteration reserves afresh
    assert ledger.hold(run=run, iteration=2, amount=1_000).pk != second
    ledger.settle(second, actual=1)  # the dead driver's late settle is a no-op
    assert chain(run)[0].spent == 3_200
    books_are_sound(*chain(run))


def test_deleting_a_run_closes_its_held_reservations(make_run):
    run = make_run()
    reservation = ledger.hold(run=run, iteration=1, amount=700).pk
    pools = chain(run)
    run.delete()
    assert Reservation.objects.get(pk=reservation).status == "abandoned"
    refresh(*pools)
    assert [(p.spent, p.reserved) for p in pools] == [(700, 0)] * 4
    books_are_sound(*pools)


# --- periods and thresholds -----------------------------------------------------------------


def test_a_daily_pool_starts_again_from_zero_lazily_with_a_ledger_entry(make_run):
    run = make_run()
    instance_pool = services.instance_pool(run.instance)
    limits.set_limit(instance_pool, 100, "admin", now=DAY1)
    Pool.objects.filter(pk=instance_pool.pk).update(
        period="daily", period_start=booking.period_floor("daily", DAY1)
    )
    ledger.settle(ledger.hold(run=run, iteration=1, amount=80, now=DAY1).pk, actual=80, now=DAY1)
    with pytest.raises(BudgetRefused):
        ledger.hold(run=run, iteration=2, amount=30, now=DAY1 + timedelta(hours=11))
    instance_pool.refresh_from_db()
    next_day = DAY1 + timedelta(hours=12, minutes=1)
    assert booking.effective_spent(instance_pool, next_day) == 0
    assert selectors.headroom_for_run(run, next_day).remaining == 100
    assert ledger.hold(run=run, iteration=2, amount=30, now=next_day).pk
    reset = LedgerEntry.objects.get(pool=instance_pool, kind="period_reset")
    assert (reset.amount, reset.spent_delta, reset.spent_after) == (80, -80, 0)
    instance_pool.refresh_from_db()
    assert instance_pool.period_start == datetime(2026, 3, 11, tzinfo=UTC)
    books_are_sound(*chain(run))


@pytest.mark.parametrize(
    ("period", "now", "start"),
    [
        ("daily", datetime(2026, 3, 10, 23, 59, tzinfo=UTC), datetime(2026, 3, 10, tzinfo=UTC)),
        ("monthly", datetime(2026, 3, 31, 23, 59, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)),
        ("monthly", datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        ("none", datetime(2026, 3, 31, tzinfo=UTC), None),
    ],
)
def test_period_floor(period, now, start):
    assert booking.period_floor(period, now) == start


def test_the_soft_threshold_is_flagged_once_per_period(make_run, django_capture_on_commit_callbacks):
    run = make_run()
    instance_pool = services.instance_pool(run.instance)
    limits.set_limit(instance_pool, 1000, "admin")
    Pool.objects.filter(pk=instance_pool.pk).update(
        period="monthly", period_start=booking.period_floor("monthly", DAY1)
    )
    heard = []

    def listener(sender, crossing, **kwargs):
        heard.append(crossing)

    threshold_crossed.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert (
                ledger.settle(
                    ledger.hold(run=run, iteration=1, amount=500, now=DAY1).pk, actual=500, now=DAY1
                )
                == []
            )
            crossed = ledger.settle(
                ledger.hold(run=run, iteration=2, amount=300, now=DAY1).pk, actual=300, now=DAY1
            )
            assert (
                ledger.settle(
                    ledger.hold(run=run, iteration=3, amount=100, now=DAY1).pk, actual=100, now=DAY1
                )
                == []
            )
        assert [c.pool_id for c in crossed] == [instance_pool.pk]
        assert crossed[0].spent == 800 and crossed[0].threshold_percent == 80 and crossed[0].run_id == run.pk
        assert heard == crossed
        assert [p.name for p in selectors.pools_over_threshold(run, DAY1)] == [instance_pool.name]
        assert LedgerEntry.objects.filter(pool=instance_pool, kind="threshold").count() == 1
        april = datetime(2026, 4, 2, tzinfo=UTC)
        assert selectors.pools_over_threshold(run, april) == []
        ledger.settle(ledger.hold(run=run, iteration=4, amount=900, now=april).pk, actual=850, now=april)
        assert LedgerEntry.objects.filter(pool=instance_pool, kind="threshold").count() == 2
    finally:
        threshold_crossed.disconnect(listener)


def test_an_unlimited_pool_never_crosses_a_threshold(make_run):
    run = make_run()
    assert ledger.settle(ledger.hold(run=run, iteration=1, amount=10**9).pk, actual=10**9) == []


# --- limits, top-ups, resets ---------------------------------------------------------------------


def test_set_limit_is_logged_with_the_person(make_run, user):
    run = make_run()
    pool = services.instance_pool(run.instance)
    limits.set_limit(pool, 5_000_000, user)
    limits.set_limit(pool, None, user)
    entries = list(LedgerEntry.objects.filter(pool=pool, kind="limit").order_by("pk"))
    assert [(e.limit_after, e.actor, e.actor_label) for e in entries] == [
        (5_000_000, user, "ada"),
        (None, user, "ada"),
    ]
    assert "unlimited" in entries[1].note


@pytest.mark.parametrize("limit", [-1, "100", 1.5, True, Decimal("3")])
def test_a_bad_limit_is_refused_and_nothing_changes(make_run, limit):
    pool = services.instance_pool(make_run().instance)
    with pytest.raises(InvalidBudget):
        limits.set_limit(pool, limit, "admin")
    pool.refresh_from_db()
    assert pool.limit is None and not LedgerEntry.objects.filter(pool=pool).exists()


def test_a_limit_below_what_is_spent_is_refused(make_run):
    run = make_run()
    pool = services.instance_pool(run.instance)
    ledger.settle(ledger.hold(run=run, iteration=1, amount=500).pk, actual=400)
    with pytest.raises(InvalidBudget, match=r"already spent \$0\.0004"):
        limits.set_limit(pool, 399, "admin")
    limits.set_limit(pool, 400, "admin")


def test_top_up_raises_the_limit_and_refuses_nonsense(make_run, user):
    pool = services.instance_pool(make_run().instance)
    with pytest.raises(InvalidBudget, match="unlimited"):
        limits.top_up(pool, 100, user)
    limits.set_limit(pool, 100, user)
    for bad in (0, -5, 2.5, "7"):
        with pytest.raises(InvalidBudget):
            limits.top_up(pool, bad, user)
    assert limits.top_up(pool, 50, user).limit == 150
    entry = LedgerEntry.objects.get(pool=pool, kind="top_up")
    assert (entry.amount, entry.limit_after, entry.actor) == (50, 150, user)


def test_reset_period_by_hand(make_run):
    run = make_run()
    pool = services.instance_pool(run.instance)
    ledger.settle(ledger.hold(run=run, iteration=1, amount=500).pk, actual=400)
    with pytest.raises(InvalidBudget, match="no period"):
        limits.reset_period(pool, "admin")
    Pool.objects.filter(pk=pool.pk).update(period="monthly")
    assert limits.reset_period(pool, "admin").spent == 0
    books_are_sound(*chain(run))


def test_run_set_cap_raises_a_cap_for_a_resume(make_run, user):
    run = make_run(max_cost_micros=100)
    ledger.settle(ledger.hold(run=run, iteration=1, amount=100).pk, actual=100)
    with pytest.raises(BudgetRefused):
        ledger.hold(run=run, iteration=2, amount=1)
    limits.set_limit(services.instance_pool(run.instance), 1_000, user)
    with pytest.raises(InvalidBudget):
        services.run_set_cap(run, 2_000, user)  # 1,900 more than the instance pool has left
    assert services.run_set_cap(run, 600, user).limit == 600
    assert ledger.hold(run=run, iteration=2, amount=500).pk


# --- reads ------------------------------------------------------------------------------------


def test_headroom_for_run_lists_the_chain_root_first_with_the_tightest_pool(make_run):
    run = make_run(max_cost_micros=900)
    services.open_run_pools(run)
    limits.set_limit(services.instance_pool(run.instance), 700, "admin")
    ledger.hold(run=run, iteration=1, amount=200)
    headroom = selectors.headroom_for_run(run)
    assert [p.kind for p in headroom.pools] == ["root", "user", "instance", "run"]
    assert [p.remaining for p in headroom.pools] == [None, None, 500, 700]
    assert headroom.remaining == 500 and headroom.limiting.kind == "instance"
    data = headroom.as_json()
    assert data["remaining_micros"] == 500 and data["pools"][3]["reserved"] == 200


def test_pools_visible_to_owners_and_staff(make_run, user, other_user):
    run = make_run()
    services.open_run_pools(run)
    assert set(selectors.pools_visible_to(user).values_list("kind", flat=True)) == {"user", "instance", "run"}
    assert not selectors.pools_visible_to(other_user).exists()
    other_user.is_staff = True
    assert selectors.pools_visible_to(other_user).count() == 4
    assert selectors.pool_as_json(chain(run)[2])["chain"]["pools"][0]["kind"] == "root"


def test_ledger_entries_are_append_only(make_run):
    run = make_run()
    ledger.hold(run=run, iteration=1, amount=1)
    entry = LedgerEntry.objects.first()
    with pytest.raises(ValueError):
        entry.save()
    with pytest.raises(ValueError):
        entry.delete()


# --- prices and estimates ---------------------------------------------------------------------


def test_prices_are_seeded_and_the_longest_prefix_wins():
    assert Price.objects.count() >= 8
    sonnet = Price.objects.for_model("claude-sonnet-4-5-20250929")
    assert sonnet.model == "claude-sonnet-4-5" and sonnet.input_usd_per_mtok == Decimal("3")
    assert Price.objects.for_model("claude-opus-4-20250514").output_usd_per_mtok == Decimal("75")
    assert Price.objects.for_model("claude-opus-4-5").output_usd_per_mtok == Decimal("25")
    haiku = Price.objects.for_model("claude-haiku-4-5")
    assert haiku.cache_write_usd_per_mtok == haiku.input_usd_per_mtok * Decimal("1.25")
    assert haiku.cache_read_usd_per_mtok == haiku.input_usd_per_mtok * Decimal("0.1")
    assert Price.objects.for_model("gpt-5") is None


def test_a_newer_price_replaces_an_older_one_from_its_date():
    Price.objects.create(
        model="claude-haiku-4-5",
        input_usd_per_mtok=2,
        output_usd_per_mtok=10,
        cache_write_usd_per_mtok="2.5",
        cache_read_usd_per_mtok="0.2",
        effective_from="2030-01-01",
    )
    from datetime import date

    assert Price.objects.for_model("claude-haiku-4-5", date(2029, 12, 31)).input_usd_per_mtok == 1
    assert Price.objects.for_model("claude-haiku-4-5", date(2030, 1, 1)).input_usd_per_mtok == 2


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (Usage(), 0),
        (Usage(model="claude-sonnet-4-5-20250929", input_tokens=1000, output_tokens=100), 3000 + 1500),
        (Usage(model="claude-haiku-4-5", cache_read_tokens=1000, cache_write_tokens=1000), 100 + 1250),
        (Usage(model="anything", input_tokens=10**6, cost_micros=42), 42),
        # tokens already spent on an unknown model are settled at the dearest rates, never for free
        (Usage(model="mystery-model", input_tokens=1000, output_tokens=1000), 15_000 + 75_000),
        (Usage(input_tokens=1000), 15_000),
    ],
)
def test_usage_cost(usage, expected):
    assert selectors.usage_cost(usage) == expected


def test_a_command_brains_iteration_reserves_the_configured_allowance_for_reported_spend(make_run):
    from instances import brains

    run = make_run()
    assert brains.iteration_reserve(run.instance) == 50_000
    with override_settings(TETHER_COMMAND_ITERATION_RESERVE_USD="0.25"):
        assert brains.iteration_reserve(run.instance) == 250_000


def test_an_anthropic_brain_reserves_nothing_up_front_its_calls_are_metered(make_run, make_instance, user):
    from instances import brains

    instance = make_instance(user, brain="anthropic", decider="llm")
    assert brains.iteration_reserve(instance) == 0  # each call reserves its own worst case (budgets.metering)


def test_a_cap_that_cannot_be_opened_at_reserve_time_is_a_refusal(make_run):
    run = make_run()
    limits.set_limit(services.instance_pool(run.instance), 100, "admin")
    run.max_cost_micros = 500  # a cap that no longer fits, and no run pool yet
    with transaction.atomic():
        with pytest.raises(BudgetRefused, match="cost cap") as refused:
            ledger.hold(run=run, iteration=1, amount=10)
        assert refused.value.pool_name == f"run {run.pk}"
        run.save()  # the caller's transaction is still usable
    assert not Pool.objects.filter(kind="run").exists()


def test_headroom_for_an_instance(make_run, make_instance, user):
    instance = make_instance(user)
    assert selectors.headroom_for_instance(instance).pools == []
    run = make_run(instance)
    ledger.hold(run=run, iteration=1, amount=25)
    assert [p.reserved for p in selectors.headroom_for_instance(instance).pools] == [25, 25, 25]


def test_a_periodic_pool_starts_at_its_period_boundary():
    root = services.root_pool()
    team = services.pool_create(kind="team", name="team", parent=root, period="monthly")
    assert team.period_start == booking.period_floor("monthly", team.created_at)


def test_the_audit_finds_books_that_do_not_balance(make_run):
    run = make_run()
    ledger.settle(ledger.hold(run=run, iteration=1, amount=100).pk, actual=60)
    ledger.hold(run=run, iteration=2, amount=30)
    pools = chain(run)
    assert selectors.audit_pools() == []
    Pool.objects.filter(pk=pools[2].pk).update(spent=61)
    Pool.objects.filter(pk=pools[0].pk).update(reserved=0)
    problems = selectors.audit_pools()
    assert len(problems) == 4
    assert any("spent 61 != ledger Σ spent_delta 60" in p for p in problems)
    assert any("reserved 0 != Σ held reservations 30" in p for p in problems)
    assert selectors.audit_pool(pools[1]) == []
