"""What every change to the pools stands on: who made it, its entries, the locks, the refusals.

The ledger (`budgets.ledger`), the lease draws (`budgets.leases`) and the limit changes
(`budgets.limits`) all lock pools through `lock_pools` — in ascending id order (SELECT ... FOR
UPDATE on PostgreSQL; on SQLite the IMMEDIATE transaction is the lock), applying any period reset
that is due — and write one append-only `LedgerEntry` per pool (`ledger_entry`) carrying the
balances after the change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from budgets.models import LedgerEntry, Pool, Reservation
from budgets.money import format_usd
from budgets.signals import threshold_crossed

type Actor = AbstractBaseUser | str | None
"""Who made a change: a user, a label ("runner", "reaper", "admin"), or None for the default."""

HELD = Reservation.Status.HELD
Kind = LedgerEntry.Kind


class BudgetRefused(Exception):
    """A pool in the run's chain has no room for the reservation."""

    def __init__(self, pool_name: str, detail: str, pool_id: int | None = None) -> None:
        super().__init__(detail)
        self.pool_name = pool_name
        self.pool_id = pool_id
        self.detail = detail


class InvalidBudget(ValueError):
    """Bad input for a budget change (a negative limit, a cap below what is spent, ...); nothing changed."""


@dataclass(frozen=True)
class ThresholdCrossing:
    """A pool's settled spend reached its soft threshold for the first time this period."""

    pool_id: int
    pool_name: str
    spent: int
    limit: int
    threshold_percent: int
    run_id: int | None

    @property
    def detail(self) -> str:
        return (
            f"pool {self.pool_name!r} has spent {format_usd(self.spent)} of its {format_usd(self.limit)} limit "
            f"(threshold {self.threshold_percent}%)"
        )


# --- time and periods ----------------------------------------------------------------


def period_floor(period: str, now: datetime) -> datetime | None:
    """Return the start (UTC) of the period containing `now`; None for pools without a period."""
    now = now.astimezone(UTC)
    if period == Pool.Period.DAILY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == Pool.Period.MONTHLY:
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


def effective_spent(pool: Pool, now: datetime | None = None) -> int:
    """Return the pool's spent as it stands at `now` (zero if a period boundary has passed)."""
    start = period_floor(pool.period, now or timezone.now())
    if start is not None and start > pool.period_start:
        return 0
    return int(pool.spent)


# --- actors and entries ----------------------------------------------------------------


def actor_of(actor: Actor, default: str) -> tuple[Any, str]:
    if actor is None:
        return None, default
    if isinstance(actor, str):
        return None, actor[:150]
    return actor, (actor.get_username() or f"user {actor.pk}")[:150]


def ledger_entry(pool: Pool, kind: str, actor: tuple[Any, str], now: datetime, **fields: Any) -> LedgerEntry:
    user, label = actor
    return LedgerEntry(
        pool_id=pool.pk,
        kind=kind,
        spent_after=pool.spent,
        reserved_after=pool.reserved,
        limit_after=pool.limit,
        actor=user,
        actor_label=label,
        created_at=now,
        **fields,
    )


# --- locking and refusing ------------------------------------------------------------


def lock_pools(pool_ids: Iterable[int], now: datetime, actor: tuple[Any, str]) -> list[Pool]:
    """Lock the pools in ascending id order and apply any due period reset; return them in that order."""
    pools = list(Pool.objects.select_for_update().filter(pk__in=sorted(set(pool_ids))).order_by("pk"))
    entries = []
    for pool in pools:
        start = period_floor(pool.period, now)
        if start is None or start <= pool.period_start:
            continue
        cleared = pool.spent
        Pool.objects.filter(pk=pool.pk).update(spent=0, period_start=start, threshold_flagged_at=None)
        pool.spent, pool.period_start, pool.threshold_flagged_at = 0, start, None
        entries.append(
            ledger_entry(
                pool,
                Kind.PERIOD_RESET,
                actor,
                now,
                amount=cleared,
                spent_delta=-cleared,
                note=f"new {pool.period} period from {start:%Y-%m-%d}; {format_usd(cleared)} spent last period",
            )
        )
    if entries:
        LedgerEntry.objects.bulk_create(entries)
    return pools


def refusal(pools: list[Pool], amount: int, run: Any, iteration: int, what: str = "") -> BudgetRefused | None:
    """Return why the chain cannot hold `amount` more (naming the innermost pool), or None.

    `what` names what needs it, if not (iteration, run) or "the call".
    """
    for pool in sorted(pools, key=lambda p: -len(p.path)):
        if pool.limit is None:
            continue
        committed = pool.spent + pool.reserved
        if committed > pool.limit:
            detail = (
                f"pool {pool.name!r} is overdrawn: spent {format_usd(pool.spent)} + reserved "
                f"{format_usd(pool.reserved)} exceeds its {format_usd(pool.limit)} limit; "
                "nothing more is granted until it is covered (top up or raise the limit)"
            )
            return BudgetRefused(pool.name, detail, pool.pk)
        if committed + amount > pool.limit:
            detail = (
                f"pool {pool.name!r} has {format_usd(pool.limit - committed)} left of its "
                f"{format_usd(pool.limit)} limit (spent {format_usd(pool.spent)}, reserved "
                f"{format_usd(pool.reserved)}); "
                + (what or (f"iteration {iteration} of run {run.pk}" if run is not None else "the call"))
                + f" needs up to {format_usd(amount)}"
            )
            return BudgetRefused(pool.name, detail, pool.pk)
    return None


def check_amount(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole, non-negative number of micro-dollars, got {value!r}")
    return value


def pool_id_of(pool: Pool | int) -> int:
    return pool if isinstance(pool, int) else pool.pk


# --- thresholds --------------------------------------------------------------------------


def over_threshold(pool: Pool) -> bool:
    if pool.limit is None or pool.threshold_percent is None:
        return False
    return bool(pool.spent * 100 >= pool.limit * pool.threshold_percent)


def announce_crossings(crossings: list[ThresholdCrossing]) -> None:
    def send() -> None:
        for crossing in crossings:
            threshold_crossed.send(sender=Pool, crossing=crossing)

    transaction.on_commit(send)
