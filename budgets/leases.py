"""Drawing a run pool's lease: slices of its ancestors' headroom (see `budgets.ledger`, "Quota leases").

`admit` finds the pools a new reservation holds money in: a run pool whose lease covers it holds
it alone; one whose lease does not draws another slice first (`draw_slice`), locking its ancestors
after it. A slice is `TETHER_BUDGET_LEASE_USD` (`slice_size`), at most a quarter of what the
tightest ancestor has left and no more than the run pool's own limit could use, or just what is
missing when that is more. Returning a lease settles money, so it lives in the ledger.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import F

from budgets.booking import BudgetRefused, Kind, ledger_entry, lock_pools, refusal
from budgets.models import LedgerEntry, Pool, Reservation
from budgets.money import usd_to_micros


def admit(
    chain: list[int], leaf: Pool | None, locked: list[Pool], amount: int, now: datetime, who: tuple[Any, str],
    what: str, also: Iterable[int] = (),
) -> tuple[list[Pool], BudgetRefused | None]:
    """Return the (locked) pools a new reservation of `amount` holds money in, or why it cannot.

    Without a lease (`leaf` None): the whole chain, `locked` already, refused if any limited pool
    lacks room. With one: the run pool and `also` (refused if they lack room), after drawing the
    slice its lease is short of from its ancestors.
    """
    if leaf is None:
        return locked, refusal(locked, amount, None, 0, what)
    also = [pk for pk in also if pk != leaf.pk]
    refused = refusal([leaf], amount, None, 0, what)
    if refused is not None:
        return [], refused
    unused = int(leaf.quota or 0) - leaf.quota_used
    short = amount - unused
    shared = lock_pools([*(chain[:-1] if short > 0 else []), *also], now, who)
    extra = [p for p in shared if p.pk in also]
    refused = refusal(extra, amount, None, 0, what)
    if refused is not None:
        return [], refused
    if short > 0:
        ancestors = [p for p in shared if p.pk in chain]
        spare = slice_size()
        if leaf.limit is not None:  # never lease more than the run pool could ever use
            spare = min(spare, leaf.limit - leaf.spent - leaf.reserved - unused)
        tightest = min((p.limit - p.spent - p.reserved for p in ancestors if p.limit is not None), default=None)
        if tightest is not None:  # nor more than a quarter of what is left: scarce headroom is shared out
            spare = min(spare, tightest // 4)
        draw = spare if spare > short and refusal(ancestors, spare, None, 0, what) is None else short
        refused = refusal(ancestors, draw, None, 0, what)
        if refused is not None:
            return [], refused
        draw_slice(leaf, ancestors, draw, who, now)
    return [leaf, *extra], None


def slice_size() -> int:
    return usd_to_micros(str(settings.TETHER_BUDGET_LEASE_USD))


def leasing() -> bool:
    """Return whether new run pools lease their headroom (`TETHER_BUDGET_LEASE_USD` above 0).

    At 0, every reservation holds money in its whole chain at once: every pool exact at every
    moment, at the price of locking the shared root and user rows on every call.
    """
    return slice_size() > 0


def draw_slice(
    leaf: Pool, ancestors: list[Pool], amount: int, who: tuple[Any, str], now: datetime, note: str = ""
) -> Reservation:
    """Hold `amount` more in `leaf`'s (locked) ancestors as a slice of its lease (no limit check: the caller's)."""
    piece: Reservation = Reservation.objects.create(
        iteration=0, amount=amount, lease_for=leaf, chain=[p.pk for p in ancestors], created_at=now,
    )
    if not amount:  # an empty slice: only what a settle beyond the lease books through it
        return piece
    Pool.objects.filter(pk__in=piece.chain).update(reserved=F("reserved") + amount)
    leaf.quota = int(leaf.quota or 0) + amount
    Pool.objects.filter(pk=leaf.pk).update(quota=leaf.quota)
    entries = []
    for pool in ancestors:
        pool.reserved += amount
        entries.append(
            ledger_entry(
                pool, Kind.RESERVE, who, now, amount=amount, reserved_delta=amount, reservation_id=piece.pk,
                run_id=leaf.run_id, note=note or f"a slice of {leaf.name}'s lease",
            )
        )
    LedgerEntry.objects.bulk_create(entries)
    return piece
