"""Limits, top-ups and period resets of a pool (admin and API), each logged in the pool's ledger.

Each locks its pool as every change does (`budgets.booking.lock_pools`). A carved pool's limit
cannot change: it is the money its parent's chain holds for it.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from budgets.booking import (
    Actor,
    InvalidBudget,
    Kind,
    actor_of,
    ledger_entry,
    lock_pools,
    over_threshold,
    pool_id_of,
)
from budgets.models import Pool, Reservation
from budgets.money import format_usd


def top_up(pool: Pool | int, amount: int, actor: Actor, *, now: datetime | None = None) -> Pool:
    """Raise a limited pool's limit by `amount` micro-dollars; return the pool as it now stands."""
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise InvalidBudget(f"a top-up must be a positive whole number of micro-dollars, got {amount!r}")
    now = now or timezone.now()
    who = actor_of(actor, "system")
    with transaction.atomic():
        (locked,) = lock_pools([pool_id_of(pool)], now, who)
        _refuse_carved(locked)
        if locked.limit is None:
            raise InvalidBudget(f"pool {locked.name!r} is unlimited; set a limit instead of topping it up")
        before = locked.limit
        locked.limit = before + amount
        _refresh_threshold_flag(locked)
        Pool.objects.filter(pk=locked.pk).update(
            limit=locked.limit, threshold_flagged_at=locked.threshold_flagged_at
        )
        ledger_entry(
            locked,
            Kind.TOP_UP,
            who,
            now,
            amount=amount,
            note=f"limit {format_usd(before)} -> {format_usd(locked.limit)}",
        ).save()
    return locked


def set_limit(pool: Pool | int, limit: int | None, actor: Actor, *, now: datetime | None = None) -> Pool:
    """Set a pool's limit (None = unlimited); refuses a limit below what the pool has spent this period."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidBudget(
            f"a limit must be empty or a whole, non-negative number of micro-dollars, got {limit!r}"
        )
    now = now or timezone.now()
    who = actor_of(actor, "system")
    with transaction.atomic():
        (locked,) = lock_pools([pool_id_of(pool)], now, who)
        _refuse_carved(locked)
        if limit is not None and limit < locked.spent:
            raise InvalidBudget(
                f"pool {locked.name!r} has already spent {format_usd(locked.spent)} this period; "
                f"a limit of {format_usd(limit)} would be below that"
            )
        if limit == locked.limit:
            return locked
        before = locked.limit
        locked.limit = limit
        _refresh_threshold_flag(locked)
        Pool.objects.filter(pk=locked.pk).update(
            limit=limit, threshold_flagged_at=locked.threshold_flagged_at
        )
        ledger_entry(
            locked,
            Kind.LIMIT,
            who,
            now,
            amount=limit or 0,
            note=f"limit {format_usd(before)} -> {format_usd(limit)}",
        ).save()
    return locked


def reset_period(pool: Pool | int, actor: Actor, *, now: datetime | None = None) -> Pool:
    """Start a periodic pool's spend again from zero now (an explicit, logged period reset)."""
    now = now or timezone.now()
    who = actor_of(actor, "system")
    with transaction.atomic():
        (locked,) = lock_pools([pool_id_of(pool)], now, who)
        if locked.period == Pool.Period.NONE:
            raise InvalidBudget(f"pool {locked.name!r} has no period to reset; raise its limit instead")
        cleared = locked.spent
        locked.spent, locked.threshold_flagged_at = 0, None
        Pool.objects.filter(pk=locked.pk).update(spent=0, threshold_flagged_at=None)
        ledger_entry(
            locked,
            Kind.PERIOD_RESET,
            who,
            now,
            amount=cleared,
            spent_delta=-cleared,
            note=f"period reset by hand; {format_usd(cleared)} spent before it",
        ).save()
    return locked


def _refuse_carved(pool: Pool) -> None:
    # A carved pool's limit is the money its parent's chain holds for it: changing one alone
    # would let the child spend what was never set aside (or strand what was).
    if Reservation.objects.filter(carved=pool).exists():
        raise InvalidBudget(
            f"pool {pool.name!r} is a child run's budget, carved from its parent run's; its limit cannot change"
        )


def _refresh_threshold_flag(pool: Pool) -> None:
    # A limit raised past the spend re-arms the soft threshold for this period.
    if pool.threshold_flagged_at is not None and not over_threshold(pool):
        pool.threshold_flagged_at = None
