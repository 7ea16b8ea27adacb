"""Property-based: random reserve / settle / release / overdraft / abandon / top-up / limit / period moves
over a small pool tree, checked after every step against a shadow model and the ledger itself.

Tree:  root ─┬─ user A ─┬─ instance A1 (daily) ─┬─ run 0 (capped)
             │          │                       └─ run 1
             │          └─ instance A2 ─────────── run 2 (capped)
             └─ user B (monthly) ── instance B1 ── run 3

plus child runs carved from any run as the machine goes (delegation): the child's cap is
reserved in its parent's chain (the carve) and is the limit of the child's own pool, the
root of the child's chain; the child spends there (never more than its carve, but for an
overdraft), and when it finishes the carve settles at what the child's pool spent (and
still holds), giving the rest back to the parent's chain.

Every run pool of the tree leases its headroom: its reservations (and its children's carves)
hold money in it alone while its lease covers them, drawing a slice from its ancestors when
not; the lease returns (booked at what the run pool took) when its run finishes or parks, and
at once when a settle goes beyond it. The shadow models the slice sizes by the rules.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from budgets import booking, ledger, limits, selectors, services
from budgets.booking import BudgetRefused, InvalidBudget
from budgets.models import LedgerEntry, Pool, Reservation

START = datetime(2026, 1, 30, 20, 0, tzinfo=UTC)
LIMITS = st.one_of(st.none(), st.integers(0, 6000))
AMOUNTS = st.integers(0, 800)


@dataclass
class Shadow:
    """What a pool should hold, by the rules, independent of the ledger's code."""

    pk: int
    name: str
    period: str
    limit: int | None
    threshold: int | None
    spent: int = 0
    reserved: int = 0
    period_start: datetime = START
    flagged: bool = False
    carved: bool = False  # a child run's pool: its limit is its carve and cannot change
    quota: int | None = None  # a run pool's lease: what it holds in its ancestors
    used: int = 0  # what its reservations took of the lease
    ending: bool = False  # returned while reservations were held: the rest goes back when they settle

    def roll(self, now):
        start = booking.period_floor(self.period, now)
        if start is not None and start > self.period_start:
            self.spent, self.period_start, self.flagged = 0, start, False

    def over_threshold(self):
        return (
            self.limit is not None
            and self.threshold is not None
            and self.spent * 100 >= self.limit * self.threshold
        )


@dataclass
class Held:
    pk: int
    run: int
    iteration: int
    amount: int
    chain: list[int] = field(default_factory=list)
    lease: int | None = None  # the run pool whose lease it draws on


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self.now = START
        self.pools: dict[int, Shadow] = {}
        self.runs = []
        self.chains: list[list[int]] = []
        self.held: dict[int, Held] = {}
        self.iterations: dict[int, int] = {}
        self.carves: dict[int, Held] = {}  # by the child's index in self.runs
        self.finished: set[int] = set()  # children whose carve went back
        self.seen_entry = 0
        self.slice = 0
        self._slice_setting = None

    def teardown(self):
        if self._slice_setting is not None:
            self._slice_setting.disable()
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    # --- set-up ------------------------------------------------------------------------

    @initialize(
        root=LIMITS,
        user_a=LIMITS,
        a1=LIMITS,
        a2=LIMITS,
        user_b=LIMITS,
        cap0=st.integers(0, 3000),
        cap2=st.integers(0, 3000),
        lease_slice=st.sampled_from([0, 1, 300, 250_000]),
    )
    def build_tree(self, root, user_a, a1, a2, user_b, cap0, cap2, lease_slice):
        from django.contrib.auth import get_user_model
        from django.test import override_settings

        self.slice = lease_slice
        self._slice_setting = override_settings(TETHER_BUDGET_LEASE_USD=f"{lease_slice / 1_000_000:.6f}")
        self._slice_setting.enable()

        from instances.models import Instance
        from loops.models import Run

        users = [get_user_model().objects.create_user(name) for name in ("machine-a", "machine-b")]
        instances = [
            Instance.objects.create(owner=owner, name=name, command=["true"])
            for owner, name in ((users[0], "a1"), (users[0], "a2"), (users[1], "b1"))
        ]
        specs = [(instances[0], cap0), (instances[0], None), (instances[1], cap2), (instances[2], None)]
        for instance, cap in specs:
            run = Run.objects.create(
                instance=instance, owner=instance.owner, objective="o", max_iterations=10**6
            )
            self.runs.append(run)
            services.open_run_pools(run)
            if cap is not None:
                services.run_set_cap(run, cap, "machine")
        Pool.objects.filter(instance=instances[0]).update(
            period="daily", period_start=booking.period_floor("daily", START)
        )
        Pool.objects.filter(kind="user", owner=users[1]).update(
            period="monthly", period_start=booking.period_floor("monthly", START)
        )
        for kind, owner_or_instance, limit in (
            ("root", None, root),
            ("user", users[0], user_a),
            ("instance", instances[0], a1),
            ("instance", instances[1], a2),
            ("user", users[1], user_b),
        ):
            pool = Pool.objects.get(
                kind=kind,
                **(
                    {"owner": owner_or_instance}
                    if kind == "user"
                    else {"instance": owner_or_instance}
                    if kind == "instance"
                    else {}
                ),
            )
            if limit is not None:
                limits.set_limit(pool, limit, "machine", now=self.now)
        for pool in Pool.objects.all():
            self.pools[pool.pk] = Shadow(
                pool.pk,
                pool.name,
                pool.period,
                pool.limit,
                pool.threshold_percent,
                period_start=pool.period_start,
                quota=pool.quota,
            )
        for run in self.runs:
            self.chains.append([p.pk for p in selectors.run_chain(run)])
            self.iterations[run.pk] = 0
        self.seen_entry = LedgerEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0

    # --- helpers ---------------------------------------------------------------------------

    def shadows(self, chain):
        for pk in chain:
            self.pools[pk].roll(self.now)
        return [self.pools[pk] for pk in chain]

    def close(self, held, actual):
        crossed = []
        for pool in self.shadows(held.chain):
            pool.reserved -= held.amount
            pool.spent += actual
            if not pool.flagged and pool.over_threshold():
                pool.flagged = True
                crossed.append(pool.pk)
        self.held.pop(held.pk, None)
        if held.lease is not None:
            leaf = self.pools[held.lease]
            leaf.used += actual - held.amount
            if leaf.used > leaf.quota:  # beyond the lease: the excess goes up the chain at once
                for pool in self.shadows(self.chain_of(leaf.pk)[:-1]):
                    pool.spent += leaf.used - leaf.quota
                    if not pool.flagged and pool.over_threshold():
                        pool.flagged = True
                        crossed.append(pool.pk)
                leaf.used = leaf.quota
            if leaf.ending and not leaf.reserved:  # the last of an ended run's lease: the rest goes back
                crossed += self.return_lease(self.chain_of(leaf.pk))
        return sorted(crossed)

    @staticmethod
    def fits(pools, amount):
        return all(
            p.limit is None or (p.spent + p.reserved <= p.limit and p.spent + p.reserved + amount <= p.limit)
            for p in pools
        )

    def chain_of(self, leaf_pk):
        return next(chain for chain in self.chains if chain[-1] == leaf_pk)

    def admit(self, chain, amount):
        """Return (the pks the reservation holds money in, the leased run pool or None), or None if refused."""
        pools = self.shadows(chain)
        leaf = pools[-1]
        if leaf.quota is None:  # no lease (a carved pool, or leases turned off): the whole chain holds it
            if not self.fits(pools, amount):
                return None
            for pool in pools:
                pool.reserved += amount
            return chain, None
        if not self.fits([leaf], amount):
            return None
        unused = leaf.quota - leaf.used
        short = amount - unused
        if short > 0:
            ancestors = pools[:-1]
            spare = self.slice
            if leaf.limit is not None:
                spare = min(spare, leaf.limit - leaf.spent - leaf.reserved - unused)
            left = [p.limit - p.spent - p.reserved for p in ancestors if p.limit is not None]
            if left:
                spare = min(spare, min(left) // 4)
            draw = spare if spare > short and self.fits(ancestors, spare) else short
            if not self.fits(ancestors, draw):
                return None
            for pool in ancestors:
                pool.reserved += draw
            leaf.quota += draw
        leaf.reserved += amount
        leaf.used += amount
        leaf.ending = False
        return [leaf.pk], leaf.pk

    def return_lease(self, chain):
        """The ancestors book what the run pool spent of its lease; what it still holds stays leased."""
        leaf = self.pools[chain[-1]]
        held = leaf.reserved
        crossed = []
        for pool in self.shadows(chain[:-1]):
            pool.reserved += held - leaf.quota
            pool.spent += leaf.used - held
            if not pool.flagged and pool.over_threshold():
                pool.flagged = True
                crossed.append(pool.pk)
        leaf.quota, leaf.used, leaf.ending = held, held, bool(held)
        return crossed

    # --- moves -------------------------------------------------------------------------------

    @rule(which=st.integers(0, 7), amount=AMOUNTS)
    def reserve(self, which, amount):
        which %= len(self.runs)  # the four runs of the tree and any child runs carved since
        if which in self.finished:
            return  # a finished run reserves nothing more
        run = self.runs[which]
        self.iterations[run.pk] += 1
        iteration = self.iterations[run.pk]
        pools = self.shadows(self.chains[which])
        limited = {p.name for p in pools if p.limit is not None}
        try:
            pk = ledger.hold(run=run, iteration=iteration, amount=amount, now=self.now).pk
        except BudgetRefused as refused:
            event("reserve refused")
            assert self.admit(self.chains[which], amount) is None, f"refused although the rules grant it: {refused.detail}"
            assert refused.pool_name in limited
            return
        event("reserve granted")
        admitted = self.admit(self.chains[which], amount)
        assert admitted is not None, "granted although a pool had no room"
        chain, lease = admitted
        if lease is not None:
            event("reserve on a lease")
        self.held[pk] = Held(pk, which, iteration, amount, chain, lease)
        # the invariant at the moment of the grant, on the real rows it holds money in (a slice
        # drawn for it up the chain is checked with every reserve entry, below)
        for pool in Pool.objects.filter(pk__in=chain):
            assert pool.limit is None or pool.spent + pool.reserved <= pool.limit

    @rule(which=st.integers(0, 7), amount=st.integers(0, 150))
    def reserve_a_little(self, which, amount):
        self.reserve(which, amount)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def reserve_the_same_iteration_again(self, data):
        held = self.held[data.draw(st.sampled_from(sorted(self.held)))]
        again = ledger.hold(
            run=self.runs[held.run], iteration=held.iteration, amount=data.draw(AMOUNTS), now=self.now
        ).pk
        assert again == held.pk
        self.shadows(held.chain)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), share=st.floats(0, 1))
    def settle(self, data, share):
        held = self.held[data.draw(st.sampled_from(sorted(self.held)))]
        actual = int(held.amount * share)
        crossings = ledger.settle(held.pk, actual=actual, now=self.now)
        if crossings:
            event("threshold crossed")
        assert sorted(c.pool_id for c in crossings) == self.close(held, actual)
        assert ledger.settle(held.pk, actual=actual + 1, now=self.now) == []  # idempotent

    @precondition(lambda self: self.held)
    @rule(data=st.data(), extra=st.integers(1, 2000))
    def overdraw(self, data, extra):
        held = self.held[data.draw(st.sampled_from(sorted(self.held)))]
        crossings = ledger.settle(held.pk, actual=held.amount + extra, now=self.now)
        assert sorted(c.pool_id for c in crossings) == self.close(held, held.amount + extra)
        assert Reservation.objects.get(pk=held.pk).overdraft == extra

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        held = self.held[data.draw(st.sampled_from(sorted(self.held)))]
        ledger.release(held.pk, now=self.now)
        self.close(held, 0)

    @rule(which=st.integers(0, 7))
    def abandon(self, which):
        which %= len(self.runs)
        mine = [h for h in self.held.values() if h.run == which]
        assert ledger.close_abandoned(self.runs[which], now=self.now) == sum(h.amount for h in mine)
        for held in mine:
            self.close(held, held.amount)

    @precondition(lambda self: len(self.runs) < 8)
    @rule(parent=st.integers(0, 7), cap=st.integers(0, 2500))
    def carve(self, parent, cap):
        """Delegation: a child run whose cap is reserved in its parent's chain and is its own pool."""
        from loops.models import Run

        parent %= len(self.runs)
        if parent in self.finished:
            return  # a finished run delegates nothing
        above = self.runs[parent]
        child = Run.objects.create(
            instance=above.instance, owner=above.owner, objective="child", max_iterations=10**6,
            parent=above, depth=above.depth + 1, max_cost_micros=cap,
        )
        before = {pk: (p.spent, p.reserved, p.quota, p.used) for pk, p in self.pools.items()}
        admitted = self.admit(self.chains[parent], cap)
        try:
            pool = services.open_run_pools(child, now=self.now)  # the machine's clock, not the wall's
        except InvalidBudget:
            event("carve refused")
            assert admitted is None, "a carve that fits the parent's headroom was refused"
            assert not Pool.objects.filter(run=child).exists()  # nothing is left behind
            for pk, (spent, reserved, quota, used) in before.items():  # the rules' draft undone
                shadow = self.pools[pk]
                shadow.spent, shadow.reserved, shadow.quota, shadow.used = spent, reserved, quota, used
            return
        event("carve granted")
        assert admitted is not None, "carved more than the parent's chain had left"
        chain, lease = admitted
        assert [p.pk for p in selectors.run_chain(child)] == [pool.pk]  # the child's chain is its own pool
        assert pool.limit == cap and pool.parent_id == (self.chains[parent][-1])
        assert pool.quota is None  # a carve needs no lease: its limit is set aside already
        held = Reservation.objects.get(carved=pool)
        assert (held.status, held.amount, held.run_id, held.chain) == ("held", cap, None, chain)
        self.pools[pool.pk] = Shadow(pool.pk, pool.name, pool.period, pool.limit, pool.threshold_percent,
                                     period_start=pool.period_start, carved=True)
        self.runs.append(child)
        self.chains.append([pool.pk])
        self.iterations[child.pk] = 0
        self.carves[len(self.runs) - 1] = Held(held.pk, len(self.runs) - 1, 0, cap, chain, lease)

    @precondition(lambda self: set(self.carves) - self.finished)
    @rule(data=st.data())
    def child_finishes(self, data):
        """The child's finish settles its carve at what its pool spent and holds; the rest goes back."""
        which = data.draw(st.sampled_from(sorted(set(self.carves) - self.finished)))
        carve = self.carves[which]
        (own,) = self.shadows(self.chains[which])
        actual = own.spent + own.reserved
        assert ledger.refund_carve(own.pk, now=self.now) == actual
        assert ledger.refund_carve(own.pk, now=self.now) is None  # exactly once
        event("carve refunded" + (" with money still held" if own.reserved else ""))
        self.close(carve, actual)
        self.finished.add(which)
        assert Reservation.objects.get(pk=carve.pk).actual == actual

    @rule(which=st.integers(0, 3))
    def run_parks_or_finishes(self, which):
        """The run's lease goes back: its ancestors book what it took, and have the rest back."""
        leaf = self.pools[self.chains[which][-1]]
        only_held = leaf.quota == leaf.reserved == leaf.used
        expected = leaf.used - leaf.reserved if leaf.quota and not only_held else 0
        assert ledger.return_run_lease(self.runs[which].pk, now=self.now) == expected
        event("lease returned" + (" with money still held" if leaf.reserved else "") if expected or leaf.quota else "no lease")
        if leaf.quota and not only_held:
            self.return_lease(self.chains[which])
        elif leaf.quota:
            leaf.ending = True
        assert ledger.return_run_lease(self.runs[which].pk, now=self.now) == 0  # once

    @rule(data=st.data(), amount=st.integers(-5, 3000))
    def top_up(self, data, amount):
        shadow = self.pools[data.draw(st.sampled_from(sorted(self.pools)))]
        if shadow.limit is None or amount <= 0 or shadow.carved:
            with pytest.raises(InvalidBudget):
                limits.top_up(shadow.pk, amount, "machine", now=self.now)
            return
        limits.top_up(shadow.pk, amount, "machine", now=self.now)
        shadow.roll(self.now)
        shadow.limit += amount
        if shadow.flagged and not shadow.over_threshold():
            shadow.flagged = False

    @rule(data=st.data(), limit=st.one_of(st.none(), st.integers(-5, 5000)))
    def set_limit(self, data, limit):
        shadow = self.pools[data.draw(st.sampled_from(sorted(self.pools)))]
        shadow.roll(self.now)
        if shadow.carved or (limit is not None and (limit < 0 or limit < shadow.spent)):
            with pytest.raises(InvalidBudget):
                limits.set_limit(shadow.pk, limit, "machine", now=self.now)
            return
        limits.set_limit(shadow.pk, limit, "machine", now=self.now)
        shadow.limit = limit
        if shadow.flagged and not shadow.over_threshold():
            shadow.flagged = False

    @rule(data=st.data())
    def reset_period_by_hand(self, data):
        shadow = self.pools[data.draw(st.sampled_from(sorted(self.pools)))]
        event(f"reset period of a {shadow.period} pool")
        if shadow.period == "none":
            with pytest.raises(InvalidBudget):
                limits.reset_period(shadow.pk, "machine", now=self.now)
            return
        limits.reset_period(shadow.pk, "machine", now=self.now)
        shadow.roll(self.now)
        shadow.spent, shadow.flagged = 0, False

    @rule(hours=st.sampled_from([1, 5, 24, 24 * 31]))
    def time_passes(self, hours):
        self.now += timedelta(hours=hours)

    # --- checks after every step -----------------------------------------------------------

    @invariant()
    def books_balance(self):
        if not self.pools:
            return
        assert selectors.audit_pools(self.pools) == []
        for pool in Pool.objects.filter(pk__in=self.pools):
            shadow = self.pools[pool.pk]
            shadow.roll(self.now)
            assert (booking.effective_spent(pool, self.now), pool.reserved, pool.limit) == (
                shadow.spent,
                shadow.reserved,
                shadow.limit,
            ), shadow.name
        held = Reservation.objects.filter(status="held")
        carves = [c.pk for i, c in self.carves.items() if i not in self.finished]
        assert sorted(held.filter(lease_for=None).values_list("pk", flat=True)) == sorted([*self.held, *carves])
        slices = {}
        for leaf, amount in held.exclude(lease_for=None).values_list("lease_for", "amount"):
            slices[leaf] = slices.get(leaf, 0) + amount
        assert slices == {pk: p.quota for pk, p in self.pools.items() if p.quota}  # a lease is its slices

    @invariant()
    def a_lease_covers_what_its_run_pool_holds(self):
        for pool in Pool.objects.filter(pk__in=self.pools, quota__isnull=False):
            shadow = self.pools[pool.pk]
            assert (pool.quota, pool.quota_used, pool.lease_ending) == (shadow.quota, shadow.used, shadow.ending), shadow.name
            assert 0 <= pool.quota_used <= pool.quota

    @invariant()
    def a_child_spends_within_its_carve(self):
        overdrawn = set(LedgerEntry.objects.filter(kind="overdraft").values_list("pool_id", flat=True))
        for which, carve in self.carves.items():
            (pk,) = self.chains[which]
            pool = Pool.objects.get(pk=pk)
            assert pool.limit == carve.amount  # the carve is the child's limit, and stays it
            assert pk in overdrawn or pool.spent + pool.reserved <= carve.amount

    @invariant()
    def every_grant_kept_spent_plus_reserved_within_the_limit(self):
        fresh = LedgerEntry.objects.filter(pk__gt=self.seen_entry, kind="reserve")
        for entry in fresh:
            assert entry.limit_after is None or entry.spent_after + entry.reserved_after <= entry.limit_after
        self.seen_entry = (
            LedgerEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or self.seen_entry
        )


@pytest.mark.slow  # hundreds of ledger moves, checked after each
@pytest.mark.django_db
def test_the_books_balance_after_any_sequence_of_ledger_moves():
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
