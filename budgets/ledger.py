"""Reserve / settle / release money up a run's pool chain.

Moves money. Every function runs inside the caller's transaction when there is one
(without a savepoint) and opens its own otherwise. The pools a change touches are
locked in ascending id order (SELECT ... FOR UPDATE on PostgreSQL; on SQLite the
IMMEDIATE transaction is the lock), so concurrent reservers cannot deadlock. Each
change writes one append-only `LedgerEntry` per pool carrying the balances after it.

Rules: a reservation is granted only if every limited pool of the chain keeps
`spent + reserved + amount <= limit`; `settle` releases the reservation and adds the
actual cost, even when it exceeds the reservation (an overdraft: the only way `spent`
can pass a limit) — after which that pool grants nothing until it is covered. A period
(daily / monthly, UTC) restarts `spent` from zero lazily, the first time the pool is
touched in the new period. A soft threshold is flagged once per period: `settle`
returns the crossings and sends `budgets.signals.threshold_crossed` after commit.

A child run's budget is carved (`carve`): its cap is reserved up its parent run's chain
like any reservation, and becomes the limit of the child's pool, whose chain starts at
itself — the child's calls lock and spend only its own pool, and can never spend what
was not set aside for it. When the child finishes, `refund_carve` settles the carve at
what the child's pool spent: the parent's chain books that as spent and has the rest back.

Quota leases keep the shared rows cold. A run pool (`Pool.quota` not None) holds a lease: slices
of its ancestors' headroom, each a reservation of its own in the ancestors (`lease_for`). Its
run's reservations (and its children's carves) hold money in the run pool alone (`on_lease`)
while the lease covers them, so a metered call locks one row. When it does not, the lease draws
another slice — `TETHER_BUDGET_LEASE_USD` (default 0.25; 0 turns leases off for new runs), at
most a quarter of what the tightest ancestor has left and no more than the run pool's own limit
could use, or just what is missing when that is more — locking the run pool first and then its
ancestors. A run's own reservation is never refused where an exact reservation up the chain
would have been granted; what another run's lease holds unused is, like any reservation, not
free for others until it returns. `return_lease` (the run finished, parked, handed its slice of
time back, or was deleted) settles the slices at what the run pool spent of them and gives the
rest back; what is still held there (a child's carve, a call in flight) stays leased, exactly,
until it settles. So a run pool's `spent` is exact at every settle, its ancestors' `spent +
reserved` always covers their subtree's, `spent` up the tree is exact once the slices return,
and no pool is ever over-admitted. A settle beyond the lease (a self-reported overdraft)
returns the lease at once, so the overdraft reaches every ancestor and blocks it until covered.

`BudgetRefused` is raised after the work is done, so a caller that catches it inside
its own `atomic()` block can carry on in the same transaction.

Around it: `budgets.booking` (the locks, entries, refusals and periods every change stands on),
`budgets.leases` (drawing a lease's slices), `budgets.limits` (limits, top-ups, period resets) and
`budgets.retry` (retrying a whole transaction).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import OperationalError, transaction
from django.db.models import F, Subquery
from django.utils import timezone

from budgets.booking import (
    HELD,
    Actor,
    BudgetRefused,
    InvalidBudget,
    Kind,
    ThresholdCrossing,
    actor_of,
    announce_crossings,
    check_amount,
    ledger_entry,
    lock_pools,
    over_threshold,
    period_floor,
    pool_id_of,
    refusal,
)
from budgets.leases import admit, draw_slice
from budgets.models import LedgerEntry, Pool, Reservation
from budgets.money import format_usd


def _chain_for_run(run: Any) -> list[int]:
    """Return the ids of the run's pool chain, root first, opening its pools if they do not exist yet."""
    path = Pool.objects.filter(kind=Pool.Kind.RUN, run_id=run.pk).values_list("path", flat=True).first()
    if path is None:
        from budgets.services import open_run_pools  # lazy: budgets.services imports this module

        return open_run_pools(run).chain_ids()
    return [int(part) for part in path.strip("/").split("/") if part]


# --- reserve / settle / release / close -----------------------------------------------------


class Held(NamedTuple):
    """A held reservation as its holder knows it: what closing it needs, so `settle` need not read it again."""

    pk: int
    chain: list[int]
    amount: int
    run_id: int | None
    iteration: int
    on_lease_id: int | None

    def as_reservation(self) -> Reservation:
        return Reservation(
            pk=self.pk, status=HELD, chain=list(self.chain), amount=self.amount, run_id=self.run_id,
            iteration=self.iteration, on_lease_id=self.on_lease_id,
        )


def hold(
    *,
    run: Any,
    iteration: int,
    amount: int,
    call: int = 0,
    model: str = "",
    actor: Actor = None,
    now: datetime | None = None,
    pool: Pool | None = None,
) -> Held:
    """Hold `amount` micro-dollars for (run, iteration, call) in every pool of its chain; return the reservation.

    `call` 0 is the iteration's own reservation; 1, 2, ... are metered model calls.
    Idempotent: while a reservation for (run, iteration, call) is held, it is returned again.
    Opens the run's pools if they do not exist yet. Raises `BudgetRefused` naming the pool.
    A run pool with a lease holds it in itself alone, drawing a slice from its ancestors first
    when the lease cannot cover it. With `run=None`, holds it in `pool`'s chain instead (a model
    call made for no run, such as a one-off decision asked through the API); such a reservation
    has no run and no key. The answer is a `Held` (its `pk` the reservation's id): a `settle`
    given it writes without reading it first.
    """
    amount = check_amount("amount", amount)
    now = now or timezone.now()
    who = actor_of(actor, "runner")
    if run is None and pool is None:
        raise ValueError("a reservation needs a run or a pool")
    with transaction.atomic(savepoint=False):
        refused = _reserve(run, pool, iteration, call, model, amount, now, who)
        if not isinstance(refused, BudgetRefused):
            return refused
    raise refused  # out here: a caller catching it inside its own atomic() can carry on


def _reserve(
    run: Any, pool: Pool | None, iteration: int, call: int, model: str, amount: int, now: datetime,
    who: tuple[Any, str],
) -> Held | BudgetRefused:
    """Reserve (inside the caller's transaction); return the reservation, or the refusal."""
    if run is None:
        assert pool is not None
        chain = pool.chain_ids()
        leaf, locked = None, lock_pools(chain, now, who)
    else:
        try:
            chain, leaf, locked = _lock_run(run, now, who, key=(iteration, call))
        except BudgetRefused as cannot:
            return cannot
        # Whether this key is held already came with the leased run pool's lock; else it is asked.
        if leaf is None or leaf.held_pk is not None:
            held = _holding(run.pk, iteration, call).values_list(*Held._fields).first()
            if held is not None:
                return Held(*held)
    run_id = None if run is None else run.pk
    pools, no = admit(chain, leaf, locked, amount, now, who, f"iteration {iteration} of run {run_id}" if run else "")
    if no is not None:
        return no
    return _hold(pools, amount, who, now, lease=leaf, run_id=run_id, iteration=iteration, call=call, model=model)


def _holding(run_id: int, iteration: int, call: int) -> Any:
    return Reservation.objects.filter(run_id=run_id, iteration=iteration, call=call, status=HELD)


def _lock_run(
    run: Any, now: datetime, who: tuple[Any, str], also: Iterable[int] = (), key: tuple[int, int] | None = None
) -> tuple[list[int], Pool | None, list[Pool]]:
    """Lock what a reservation of `run` starts with: (its chain, its leased run pool or None, the pools locked).

    One statement when its run pool holds a lease (found by its run): that pool alone; a slice
    drawn later locks its ancestors after it. Otherwise (leases off, a carved pool) the whole
    chain and `also`, in ascending id order like every lock of shared pools. Opens the run's
    pools if they do not exist yet. With `key` (iteration, call), the leased pool comes with
    `held_pk`: the id of that key's reservation if one is held already, else None.
    """
    leased = Pool.objects.select_for_update().filter(kind=Pool.Kind.RUN, run_id=run.pk, quota__isnull=False)
    if key is not None:
        leased = leased.annotate(held_pk=Subquery(_holding(run.pk, *key).values("pk")[:1]))
    mine = leased.first()
    if mine is None:
        try:
            chain = _chain_for_run(run)
        except InvalidBudget as error:
            raise BudgetRefused(f"run {run.pk}", f"run {run.pk} cannot have its cost cap: {error}") from error
        mine = leased.first()  # opened just now, with a lease
        if mine is None:
            return chain, None, lock_pools([*chain, *also], now, who)
    return mine.chain_ids(), mine, []


def _hold(
    pools: list[Pool], amount: int, who: tuple[Any, str], now: datetime, *, lease: Pool | None,
    run_id: int | None = None, iteration: int = 0, call: int = 0, model: str = "", carved: Pool | None = None,
    note: str = "",
) -> Held:
    """Create the reservation of `amount` in the (locked, admitted) `pools`."""
    reservation = Reservation.objects.create(
        run_id=run_id, iteration=iteration, call=call, model=model[:100], amount=amount, carved=carved,
        on_lease=lease, chain=[p.pk for p in pools], created_at=now,
    )
    if lease is not None:
        lease.quota_used += amount
        lease.lease_ending = False  # its run goes on (resumed): the lease lives again
        Pool.objects.filter(pk=lease.pk).update(
            reserved=F("reserved") + amount, quota_used=lease.quota_used, lease_ending=False
        )
        if len(pools) > 1:
            Pool.objects.filter(pk__in=[p.pk for p in pools[1:]]).update(reserved=F("reserved") + amount)
    else:
        Pool.objects.filter(pk__in=reservation.chain).update(reserved=F("reserved") + amount)
    entries = []
    for locked in pools:
        locked.reserved += amount
        entries.append(
            ledger_entry(
                locked, Kind.RESERVE, who, now, amount=amount, reserved_delta=amount,
                reservation_id=reservation.pk, run_id=run_id, iteration=iteration, note=note,
            )
        )
    LedgerEntry.objects.bulk_create(entries)
    return Held(int(reservation.pk), reservation.chain, amount, run_id, iteration, None if lease is None else lease.pk)


def settle(
    reservation: int | Held | None, *, actual: int, actor: Actor = None, now: datetime | None = None,
    usage: dict[str, int] | None = None,
) -> list[ThresholdCrossing]:
    """Close the reservation at the measured cost `actual`, refunding the rest; record `usage` (tokens) on it.

    Idempotent: a reservation that is no longer held is left alone (returns []). Settles
    beyond the reservation too (an overdraft). Returns the soft thresholds this crossed.
    Given as `Held`, it is not read first: the write itself is guarded on its being held.
    """
    if reservation is None:
        return []
    actual = check_amount("actual", actual)
    return _close(
        reservation, actual, Kind.SETTLE, Reservation.Status.SETTLED, actor_of(actor, "runner"), now, usage
    )


def roll(held: Held | None, *, actual: int, run: Any, iteration: int, amount: int, now: datetime | None = None) -> Held:
    """Settle the iteration's reservation `held` at `actual` and hold `amount` for `iteration`: one iteration to the next.

    Inside the caller's transaction. In a steady iteration — the run's lease covers both, no
    overdraft, no period reset or threshold due — that is one lock of the run's own pool, one
    write of it, the two reservations and one insert of both entries. Anything else is the
    `settle` and the `hold` it stands for, one after the other; raises `BudgetRefused` as `hold` does.
    """
    actual, amount = check_amount("actual", actual), check_amount("amount", amount)
    now = now or timezone.now()
    with transaction.atomic(savepoint=False):
        leaf = (
            Pool.objects.select_for_update().filter(kind=Pool.Kind.RUN, run_id=run.pk, quota__isnull=False)
            .annotate(held_pk=Subquery(_holding(run.pk, iteration, 0).values("pk")[:1])).first()
        )
        if leaf is not None and held is not None and _rolls(leaf, held, actual, amount, now):
            if Reservation.objects.filter(pk=held.pk, status=HELD, on_lease_id=leaf.pk).update(
                status=Reservation.Status.SETTLED, actual=actual, overdraft=0, closed_at=now
            ):
                return _rolled(leaf, held, actual, run, iteration, amount, now)
            held = None  # closed meanwhile (a stop that judged this driver dead): there is nothing to settle
    settle(held, actual=actual, now=now)  # out here: a refused hold leaves the caller's transaction usable
    return hold(run=run, iteration=iteration, amount=amount, now=now)


def _rolled(leaf: Pool, held: Held, actual: int, run: Any, iteration: int, amount: int, now: datetime) -> Held:
    """`roll`'s steady case, with `held` settled already: book it, and hold `amount` in the run's pool alone."""
    who = actor_of(None, "runner")
    reserved_before = leaf.reserved
    leaf.reserved -= held.amount
    leaf.spent += actual
    settled = ledger_entry(
        leaf, Kind.SETTLE, who, now, amount=actual, spent_delta=actual, reserved_delta=-held.amount,
        reservation_id=held.pk, run_id=run.pk, iteration=held.iteration,
    )
    reservation = Reservation.objects.create(
        run_id=run.pk, iteration=iteration, amount=amount, on_lease=leaf, chain=[leaf.pk], created_at=now,
    )
    leaf.reserved += amount
    leaf.quota_used += actual - held.amount + amount
    Pool.objects.filter(pk=leaf.pk).update(
        reserved=F("reserved") + (leaf.reserved - reserved_before), spent=F("spent") + actual,
        quota_used=leaf.quota_used,
    )
    reserved = ledger_entry(
        leaf, Kind.RESERVE, who, now, amount=amount, reserved_delta=amount, reservation_id=reservation.pk,
        run_id=run.pk, iteration=iteration,
    )
    LedgerEntry.objects.bulk_create([settled, reserved])
    return Held(int(reservation.pk), [leaf.pk], amount, run.pk, iteration, leaf.pk)


def _rolls(leaf: Pool, held: Held, actual: int, amount: int, now: datetime) -> bool:
    """Whether settling `held` and holding `amount` in the (locked) leased `leaf` alone is all there is to do."""
    start = period_floor(leaf.period, now)
    if start is not None and start > leaf.period_start:
        return False  # a period reset is due: the general path books it
    if held.on_lease_id != leaf.pk or held.chain != [leaf.pk] or getattr(leaf, "held_pk", None) is not None:
        return False
    if actual > held.amount or leaf.lease_ending:
        return False  # an overdraft, or a lease that goes back once nothing is held
    after = Pool(
        limit=leaf.limit, spent=leaf.spent + actual, reserved=leaf.reserved - held.amount,
        threshold_percent=leaf.threshold_percent,
    )
    if over_threshold(after) and leaf.threshold_flagged_at is None:
        return False  # a soft threshold is crossed: the general path announces it
    unused = int(leaf.quota or 0) - (leaf.quota_used + actual - held.amount)
    return amount <= unused and refusal([after], amount, None, 0) is None


def release(reservation_id: int | None, *, actor: Actor = None, now: datetime | None = None) -> None:
    """Give the whole reservation back: the act never ran, nothing was spent. Idempotent."""
    if reservation_id is None:
        return
    _close(reservation_id, 0, Kind.RELEASE, Reservation.Status.RELEASED, actor_of(actor, "runner"), now)


def carve(
    *, parent: Any, pool: Pool, amount: int, actor: Actor = None, now: datetime | None = None,
    also: Iterable[int] = (),
) -> int:
    """Hold `amount` in `parent` run's chain as the budget of `pool` (its child run's); return the carve's id.

    The caller created `pool` with limit `amount` and a chain of its own (`services.open_run_pools`).
    `also`: more pools to hold it in (the child's own instance pool, when it runs on another
    instance); they book the child's spend when the carve is refunded, as the chain does.
    Raises `BudgetRefused` naming the pool that has no room. Idempotent: a pool already carved
    has its carve's id returned.
    """
    amount = check_amount("amount", amount)
    now = now or timezone.now()
    who = actor_of(actor, "runner")
    with transaction.atomic(savepoint=False):
        done = Reservation.objects.filter(carved=pool).values_list("pk", flat=True).first()
        if done is not None:
            return int(done)
        chain, leaf, locked = _lock_run(parent, now, who, also)
        pools, refused = admit(chain, leaf, locked, amount, now, who, "the child run's budget", also)
        if refused is None:
            return _hold(
                pools, amount, who, now, lease=leaf, carved=pool,
                note=f"carved for {pool.name} from run {parent.pk}'s budget",
            ).pk
    raise refused


def refund_carve(pool: Pool | int, *, actor: Actor = None, now: datetime | None = None) -> int | None:
    """Settle `pool`'s carve (its run finished) at what the pool spent; return that, or None if none is held.

    The parent's chain books the child's spend (its whole subtree's: grandchildren's carves
    settle into it) and has the rest of the carve back. What the pool still holds counts as
    spent (a call still out, a grandchild still running when a stop cascades): conservative,
    never under the child's spend. Idempotent: a carve no longer held is left alone.
    """
    now = now or timezone.now()
    who = actor_of(actor, "runner")
    with transaction.atomic(savepoint=False):
        held = Reservation.objects.filter(carved=pool, status=HELD).values_list("pk", "chain").first()
        if held is None:
            return None
        pk, chain = held
        child_id = pool_id_of(pool)
        locked = {p.pk: p for p in lock_pools([*chain, child_id], now, who)}
        reservation = Reservation.objects.select_for_update().get(pk=pk)
        if reservation.status != HELD:
            return None
        child = locked[child_id]
        actual = int(child.spent + child.reserved)
        _apply_close(
            reservation, [locked[p] for p in chain], actual, Kind.SETTLE, Reservation.Status.SETTLED, who, now,
            note=f"refund of {child.name}'s carve: {format_usd(actual)} spent of {format_usd(reservation.amount)}",
        )
    return actual


def close_abandoned(run: Any, *, actor: Actor = None, now: datetime | None = None) -> int:
    """Settle every reservation still held on `run` at its reserved amount (a dead driver's); return the total.

    Conservative: the act may have spent up to the reservation, so all of it counts as spent.
    """
    now = now or timezone.now()
    who = actor_of(actor, "reaper")
    total = 0
    with transaction.atomic(savepoint=False):
        held = list(Reservation.objects.filter(run_id=run.pk, status=HELD).values_list("pk", "chain"))
        if not held:
            return 0
        pools = {p.pk: p for p in lock_pools((pk for _, chain in held for pk in chain), now, who)}
        for reservation in (
            Reservation.objects.select_for_update().filter(pk__in=[pk for pk, _ in held]).order_by("pk")
        ):
            if reservation.status != HELD:
                continue
            _apply_close(
                reservation,
                [pools[pk] for pk in reservation.chain],
                reservation.amount,
                Kind.ABANDONED,
                Reservation.Status.ABANDONED,
                who,
                now,
            )
            total += reservation.amount
    return total


def _close(
    held: int | Held, actual: int, kind: str, status: str, who: tuple[Any, str], now: datetime | None,
    usage: dict[str, int] | None = None,
) -> list[ThresholdCrossing]:
    now = now or timezone.now()
    reservation_id = held.pk if isinstance(held, Held) else held
    with transaction.atomic(savepoint=False):
        for attempt in range(5):
            if isinstance(held, Held) and attempt == 0:
                reservation = held.as_reservation()  # as its holder knows it; the guarded write checks
            else:
                found = Reservation.objects.filter(pk=reservation_id).only(*_CLOSING).first()
                if found is None:
                    raise Reservation.DoesNotExist(f"no reservation {reservation_id}")
                reservation = found
            if reservation.status != HELD:
                return []
            pools = lock_pools(reservation.chain, now, who)
            # Guarded: closed (or its lease given back) between the read and the lock, it is read again.
            closed = _apply_close(reservation, pools, actual, kind, status, who, now, guarded=True, usage=usage)
            if closed is not None:
                return list(closed)
    raise OperationalError(f"reservation {reservation_id} kept changing while it was being closed")


# What closing a reservation reads of it.
_CLOSING = ("status", "chain", "amount", "run_id", "iteration", "on_lease_id")


def _apply_close(
    reservation: Reservation,
    pools: list[Pool],
    actual: int,
    kind: str,
    status: str,
    who: tuple[Any, str],
    now: datetime,
    note: str = "",
    announce: bool = True,
    cause: Reservation | None = None,
    guarded: bool = False,
    usage: dict[str, int] | None = None,
    keeps: int = 0,
) -> Any:
    """Move the reservation out of `reserved` and `actual` into `spent` on every (locked) pool.

    Sends the soft thresholds it crossed after commit unless `announce` is False (then the caller does).
    `cause`: the run's reservation whose settle this is booking up the chain (a lease slice returned
    at once for an overdraft); the entries name its run and iteration. `guarded`: the reservation
    was read without a lock; if it is no longer held as read, nothing is written and None returned.
    `keeps`: what of it stays held (a lease slice returned in part, see `_return`): only the rest is
    closed, and the reservation stays held with `keeps` — its money never leaves the pools to come back.
    """
    amount = reservation.amount - keeps
    run_id, iteration = (cause.run_id, cause.iteration) if cause is not None else (reservation.run_id, reservation.iteration)
    overdraft = max(0, actual - amount)
    if not _close_row(reservation, status, actual, overdraft, now, guarded, usage, keeps):
        return None
    lease = _move_money(pools, reservation.on_lease_id, amount, actual)
    if keeps:
        reservation.amount = keeps
    else:
        reservation.status, reservation.actual, reservation.overdraft, reservation.closed_at = (status, actual, overdraft, now)
    if kind == Kind.ABANDONED:
        note = "its driver died; settled at the full reservation (conservative)"
    elif overdraft:
        exceeded = f"actual cost exceeded the reservation of {format_usd(amount)} by {format_usd(overdraft)}"
        note = f"{note}; {exceeded}" if note else exceeded
    crossings = _book_close(pools, reservation.pk, amount, actual, overdraft, kind, who, now, run_id, iteration, note)
    if lease is not None and lease.quota_used > int(lease.quota or 0):
        crossings += _book_beyond_lease(lease, reservation, who, now)
    if lease is not None and lease.lease_ending and not lease.reserved:
        crossings += _return(lease, who, now)  # the last reservation of an ended run's lease: the rest goes back
    if crossings and announce:
        announce_crossings(crossings)
    return crossings


def _close_row(
    reservation: Reservation, status: str, actual: int, overdraft: int, now: datetime, guarded: bool,
    usage: dict[str, int] | None, keeps: int,
) -> bool:
    """Write the reservation closed (or, with `keeps`, still held with that); False if `guarded` and it was not held."""
    closing = Reservation.objects.filter(pk=reservation.pk)
    if guarded:
        closing = closing.filter(status=HELD, on_lease_id=reservation.on_lease_id)
    written: dict[str, Any] = {"status": status, "actual": actual, "overdraft": overdraft, "closed_at": now}
    if usage is not None:
        written["usage"] = usage
    if keeps:
        closing.update(amount=keeps)  # still held, with what it keeps
    elif not closing.update(**written) and guarded:
        return False
    return True


def _move_money(pools: list[Pool], on_lease_id: int | None, amount: int, actual: int) -> Pool | None:
    """Take `amount` out of the pools' `reserved` and add `actual` to their `spent`; return the lease it was on."""
    lease = next((p for p in pools if p.pk == on_lease_id), None)
    if lease is not None:
        lease.quota_used += actual - amount
        Pool.objects.filter(pk=lease.pk).update(
            reserved=F("reserved") - amount, spent=F("spent") + actual, quota_used=lease.quota_used
        )
    shared = [p.pk for p in pools if p is not lease]
    if shared:
        Pool.objects.filter(pk__in=shared).update(reserved=F("reserved") - amount, spent=F("spent") + actual)
    return lease


def _book_close(
    pools: list[Pool], reservation_id: int, amount: int, actual: int, overdraft: int, kind: str,
    who: tuple[Any, str], now: datetime, run_id: int | None, iteration: int, note: str,
) -> list[ThresholdCrossing]:
    """Write the close's entries on every (locked) pool, with its overdrafts; flag and return the thresholds crossed."""
    entries = []
    crossings = []
    flagged = []
    for pool in pools:
        pool.reserved -= amount
        pool.spent += actual
        entries.append(
            ledger_entry(
                pool,
                kind,
                who,
                now,
                amount=actual,
                spent_delta=actual,
                reserved_delta=-amount,
                reservation_id=reservation_id,
                run_id=run_id,
                iteration=iteration,
                note=note,
            )
        )
        if pool.limit is None:
            continue
        if overdraft and pool.spent + pool.reserved > pool.limit:
            entries.append(
                ledger_entry(
                    pool,
                    Kind.OVERDRAFT,
                    who,
                    now,
                    amount=pool.spent + pool.reserved - pool.limit,
                    reservation_id=reservation_id,
                    run_id=run_id,
                    iteration=iteration,
                    note=f"over its limit by {format_usd(pool.spent + pool.reserved - pool.limit)}; "
                    "no new reservation until covered",
                )
            )
        if over_threshold(pool) and pool.threshold_flagged_at is None and pool.threshold_percent is not None:
            pool.threshold_flagged_at = now
            flagged.append(pool.pk)
            crossing = ThresholdCrossing(
                pool.pk, pool.name, pool.spent, pool.limit, pool.threshold_percent, run_id
            )
            crossings.append(crossing)
            entries.append(
                ledger_entry(
                    pool,
                    Kind.THRESHOLD,
                    who,
                    now,
                    amount=pool.spent,
                    run_id=run_id,
                    note=crossing.detail,
                )
            )
    if flagged:
        Pool.objects.filter(pk__in=flagged).update(threshold_flagged_at=now)
    LedgerEntry.objects.bulk_create(entries)
    return crossings


def _book_beyond_lease(
    lease: Pool, cause: Reservation, who: tuple[Any, str], now: datetime
) -> list[ThresholdCrossing]:
    """Book what the (locked) `lease` spent beyond what it holds up its chain at once, through an empty slice.

    Only a reported cost can go beyond the lease: the ancestors must see it now, and are blocked by it.
    """
    excess = lease.quota_used - int(lease.quota or 0)
    ancestors = lock_pools(lease.chain_ids()[:-1], now, who)
    piece = draw_slice(lease, ancestors, 0, who, now)
    crossings: list[ThresholdCrossing] = _apply_close(
        piece, ancestors, excess, Kind.SETTLE, Reservation.Status.SETTLED, who, now, announce=False,
        cause=cause, note=f"{lease.name} spent {format_usd(excess)} beyond its lease",
    )
    lease.quota_used = int(lease.quota or 0)
    Pool.objects.filter(pk=lease.pk).update(quota_used=lease.quota_used)
    return crossings


def return_lease(pool: Pool | int, *, actor: Actor = None, now: datetime | None = None) -> int:
    """Give back `pool`'s lease: its ancestors book what it spent and have the rest back; return what it spent.

    For a run that finished, parked, handed its slice of time back or was deleted (inside the
    transaction that did it). What the run pool still holds stays leased until it settles (see
    `_return`). Idempotent: a pool with nothing leased is left alone (returns 0).
    """
    now = now or timezone.now()
    who = actor_of(actor, "runner")
    with transaction.atomic(savepoint=False):
        locked = lock_pools([pool_id_of(pool)], now, who)
        if not locked or not locked[0].quota:
            return 0  # nothing leased
        if locked[0].quota == locked[0].reserved == locked[0].quota_used:  # only what is still held:
            if not locked[0].lease_ending:  # it goes back when that settles
                Pool.objects.filter(pk=locked[0].pk).update(lease_ending=True)
            return 0
        taken = int(locked[0].quota_used - locked[0].reserved)
        crossings = _return(locked[0], who, now)
    if crossings:
        announce_crossings(crossings)
    return taken


def return_run_lease(run_id: int, *, actor: Actor = None, now: datetime | None = None) -> int:
    """Return the lease of run `run_id`'s pool, if it holds one (see `return_lease`); return what it took."""
    pool = Pool.objects.filter(kind=Pool.Kind.RUN, run_id=run_id, quota__gt=0).values_list("pk", flat=True).first()
    return 0 if pool is None else return_lease(pool, actor=actor, now=now)


def _return(
    leaf: Pool, who: tuple[Any, str], now: datetime, cause: Reservation | None = None
) -> list[ThresholdCrossing]:
    """Settle the (locked) `leaf`'s lease slices at what it spent of them and give the rest back.

    What is still held on the lease (a child's carve, a call in flight) stays leased, exactly, on
    the newest slices that already hold it (the oldest of them returned in part): it is never drawn
    anew, so an ancestor that an overdraft took past its limit is written no reserve — nothing is
    granted there. The lease ends for good when the last of it settles (`lease_ending`).
    """
    ancestors = lock_pools(leaf.chain_ids()[:-1], now, who)
    slices = list(Reservation.objects.select_for_update().filter(lease_for=leaf, status=HELD).order_by("pk"))
    held = int(leaf.reserved)
    spent = leaf.quota_used - held
    # The slices hold the whole lease (quota >= quota_used >= held): keep `held` on the newest of them.
    keep = held
    returned: list[tuple[Reservation, int]] = []  # (slice, what of it stays held), oldest first
    for piece in reversed(slices):
        kept = min(piece.amount, keep)
        keep -= kept
        if kept < piece.amount or not piece.amount:
            returned.insert(0, (piece, kept))
    if spent > 0 and not returned:  # nothing leased, yet spent: a $0 reservation settled at a reported cost
        returned = [(draw_slice(leaf, ancestors, 0, who, now, note=f"{leaf.name} spent beyond its lease"), 0)]
    crossings: list[ThresholdCrossing] = []
    for index, (piece, kept) in enumerate(returned):
        part = piece.amount - kept
        share = spent if index == len(returned) - 1 else min(part, spent)
        spent -= share
        note = f"{leaf.name}'s lease returned: {format_usd(share)} spent of this slice's {format_usd(part)}"
        if kept:
            note += f"; {format_usd(kept)} of it stays leased for what is still held"
        crossings += _apply_close(
            piece, ancestors, share, Kind.SETTLE, Reservation.Status.SETTLED, who, now,
            note=note, announce=False, cause=cause, keeps=kept,
        )
    leaf.quota, leaf.quota_used, leaf.lease_ending = held, held, bool(held)
    Pool.objects.filter(pk=leaf.pk).update(quota=leaf.quota, quota_used=leaf.quota_used, lease_ending=leaf.lease_ending)
    return crossings
