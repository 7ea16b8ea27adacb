"""Reads for pages, the API and the runner: headroom, thresholds, prices, audits.

No writes. Balances are shown as they stand now: a pool whose period has ended shows
zero spent even before the ledger touches it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from budgets import money, pricing
from budgets.booking import effective_spent
from budgets.models import LedgerEntry, Pool, Price, Reservation

log = logging.getLogger(__name__)

# The dearest published rates (the claude-opus-4 family): the floor of what settling an unpriced model's
# tokens charges (see `usage_cost`); never used to reserve.
FALLBACK_RATES = pricing.Rates(
    input_usd_per_mtok=Decimal("15"),
    output_usd_per_mtok=Decimal("75"),
    cache_write_usd_per_mtok=Decimal("18.75"),
    cache_read_usd_per_mtok=Decimal("1.50"),
)


@dataclass(frozen=True)
class PoolHeadroom:
    id: int
    name: str
    kind: str
    period: str
    limit: int | None
    spent: int
    reserved: int
    remaining: int | None  # limit - spent - reserved; negative when overdrawn; None when unlimited
    threshold_percent: int | None
    over_threshold: bool

    @property
    def overdrawn(self) -> bool:
        return self.remaining is not None and self.remaining < 0

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["overdrawn"] = self.overdrawn
        return data


@dataclass(frozen=True)
class ChainHeadroom:
    """A run's pool chain, root first, and what it can still grant."""

    pools: list[PoolHeadroom]
    remaining: int | None  # the least any limited pool has left (never below zero); None if all unlimited
    limiting: PoolHeadroom | None

    def as_json(self) -> dict[str, Any]:
        return {
            "remaining_micros": self.remaining,
            "remaining_usd": money.format_usd(self.remaining),
            "limiting_pool": self.limiting.id if self.limiting else None,
            "pools": [p.as_json() for p in self.pools],
        }


def pool_headroom(pool: Pool, now: datetime | None = None) -> PoolHeadroom:
    spent = effective_spent(pool, now)
    remaining = None if pool.limit is None else pool.limit - spent - pool.reserved
    over = (
        pool.limit is not None
        and pool.threshold_percent is not None
        and spent * 100 >= pool.limit * pool.threshold_percent
    )
    return PoolHeadroom(
        id=pool.pk,
        name=pool.name,
        kind=pool.kind,
        period=pool.period,
        limit=pool.limit,
        spent=spent,
        reserved=pool.reserved,
        remaining=remaining,
        threshold_percent=pool.threshold_percent,
        over_threshold=over,
    )


def chain_headroom(pools: Iterable[Pool], now: datetime | None = None) -> tuple[int | None, Pool | None]:
    """Return (the least remaining of the limited pools, never below zero, and that pool).

    A run pool's unused lease (the last pool of its chain, `quota - quota_used`) is headroom
    its run still has in every ancestor, on top of what they have left.
    """
    pools = list(pools)
    leaf = max(pools, key=lambda p: len(p.path), default=None)
    unused = 0
    if leaf is not None and leaf.quota is not None and len(pools) > 1:
        unused = max(0, int(leaf.quota) - leaf.quota_used)
    best: tuple[int | None, Pool | None] = (None, None)
    for pool in pools:
        if pool.limit is None:
            continue
        left = max(0, pool.limit - effective_spent(pool, now) - pool.reserved + (0 if pool is leaf else unused))
        if best[0] is None or left < best[0]:
            best = (left, pool)
    return best


def run_chain(run: Any) -> list[Pool]:
    """Return the run's pools, root first (the run pool's chain, else the instance pool's); [] if none yet."""
    leaf = (
        Pool.objects.filter(kind=Pool.Kind.RUN, run_id=run.pk).first()
        or Pool.objects.filter(kind=Pool.Kind.INSTANCE, instance_id=run.instance_id).first()
    )
    return [] if leaf is None else _chain_of(leaf)


def headroom_for_run(run: Any, now: datetime | None = None) -> ChainHeadroom:
    """Return the run's chain with limit / spent / reserved / remaining per pool, for pages and the API."""
    return headroom_for_chain(run_chain(run), now)


def headroom_for_instance(instance: Any, now: datetime | None = None) -> ChainHeadroom:
    """Return the instance pool's chain (empty before the instance's first run)."""
    pool = Pool.objects.filter(kind=Pool.Kind.INSTANCE, instance_id=instance.pk).first()
    return headroom_for_chain([] if pool is None else _chain_of(pool), now)


def _chain_of(pool: Pool) -> list[Pool]:
    return list(Pool.objects.filter(pk__in=pool.chain_ids()).order_by("path"))


def headroom_for_pool(pool: Pool, now: datetime | None = None) -> ChainHeadroom:
    """Return `pool`'s chain, root first, for the pool API."""
    return headroom_for_chain(_chain_of(pool), now)


def headroom_for_chain(pools: list[Pool], now: datetime | None = None) -> ChainHeadroom:
    now = now or timezone.now()
    rows = [pool_headroom(p, now) for p in pools]
    remaining, limiting = chain_headroom(pools, now)
    return ChainHeadroom(
        pools=rows,
        remaining=remaining,
        limiting=next((r for r in rows if limiting is not None and r.id == limiting.pk), None),
    )


def pools_over_threshold(run: Any, now: datetime | None = None) -> list[PoolHeadroom]:
    """Return the pools of the run's chain whose spend this period is at or past their soft threshold."""
    return [p for p in headroom_for_run(run, now).pools if p.over_threshold]


def pools_visible_to(user: Any) -> QuerySet[Pool]:
    """Return the pools `user` may see: all for staff, else the pools they own."""
    if user.is_staff:
        return Pool.objects.all()
    return Pool.objects.filter(Q(owner=user) | Q(instance__owner=user) | Q(run__owner=user)).distinct()


def pool_as_json(pool: Pool, now: datetime | None = None) -> dict[str, Any]:
    row = pool_headroom(pool, now).as_json()
    row.update(
        parent=pool.parent_id,
        instance=pool.instance_id,
        run=pool.run_id,
        children=list(pool.children.values_list("pk", flat=True)),
        chain=headroom_for_pool(pool, now).as_json(),
    )
    return row


# --- prices and estimates ---------------------------------------------------------------


def price_for_model(model: str, on: Any = None) -> Price:
    """Return the price in force for `model`; `pricing.UnpricedModel` if it has none (never a guess)."""
    price: Price | None = Price.objects.for_model(model or "", on)
    if price is None:
        raise pricing.UnpricedModel(model)
    return price


def usage_cost(usage: pricing.UsageLike) -> int:
    """Return what `usage` cost in micro-dollars: as reported, else its tokens x the model's price.

    Settlement cannot refuse: the tokens are already spent. Tokens of a model with no price
    (a model deleted from the table mid-run, or a command agent naming a model it was never
    priced for) are charged at the dearest rates known, and logged, so spend is never under-counted.
    """
    if usage.cost_micros is not None:
        return pricing.cost_micros(usage, None)
    if not (usage.input_tokens or usage.output_tokens or usage.cache_write_tokens or usage.cache_read_tokens):
        return 0
    try:
        rates: pricing.RatesLike = price_for_model(usage.model)
    except pricing.UnpricedModel:
        log.warning("no price for model %r; charging its tokens at the dearest known rates", usage.model)
        rates = dearest_rates()
    return pricing.cost_micros(usage, rates)


def dearest_rates() -> pricing.RatesLike:
    """Return the dearest rates in the price table, and never below `FALLBACK_RATES`."""
    dearest: Price | None = Price.objects.order_by("-output_usd_per_mtok", "-input_usd_per_mtok").first()
    if dearest is None or dearest.output_usd_per_mtok < FALLBACK_RATES.output_usd_per_mtok:
        return FALLBACK_RATES
    return dearest


# --- audit -------------------------------------------------------------------------------


def audit_pool(pool: Pool) -> list[str]:
    """Return every way the pool's balances disagree with its ledger and reservations ([] when sound)."""
    return audit_pools([pool.pk])


def audit_pools(pool_ids: Iterable[int] | None = None) -> list[str]:
    """Return every way the pools' balances disagree with their ledger and reservations ([] when sound).

    For each pool: spent == Σ spent_delta (settles and abandoned closes, minus period resets)
    == Σ settled since its last period reset; reserved == Σ reserved_delta == Σ amounts of the
    held reservations holding money in it. Four queries, whatever the number of pools.
    """
    pools = Pool.objects.all() if pool_ids is None else Pool.objects.filter(pk__in=list(pool_ids))
    entries = LedgerEntry.objects.filter(pool__in=pools)
    sums = {
        row["pool"]: row
        for row in entries.values("pool").annotate(spent=Sum("spent_delta"), reserved=Sum("reserved_delta"))
    }
    last_reset = (
        LedgerEntry.objects.filter(pool=OuterRef("pool"), kind=LedgerEntry.Kind.PERIOD_RESET)
        .order_by("-pk")
        .values("pk")[:1]
    )
    settled = dict(
        entries.filter(kind__in=[LedgerEntry.Kind.SETTLE, LedgerEntry.Kind.ABANDONED])
        .annotate(since=Coalesce(Subquery(last_reset), 0))
        .filter(pk__gt=F("since"))
        .values("pool")
        .annotate(total=Sum("amount"))
        .values_list("pool", "total")
    )
    held = dict(
        LedgerEntry.objects.filter(
            pool__in=pools, kind=LedgerEntry.Kind.RESERVE, reservation__status=Reservation.Status.HELD
        )
        .values("pool")
        .annotate(total=Sum("reservation__amount"))
        .values_list("pool", "total")
    )
    problems = []
    for pool in pools:
        row = sums.get(pool.pk, {})
        name = pool.name
        if (row.get("spent") or 0) != pool.spent:
            problems.append(f"{name}: spent {pool.spent} != ledger Σ spent_delta {row.get('spent') or 0}")
        if (row.get("reserved") or 0) != pool.reserved:
            problems.append(
                f"{name}: reserved {pool.reserved} != ledger Σ reserved_delta {row.get('reserved') or 0}"
            )
        if settled.get(pool.pk, 0) != pool.spent:
            problems.append(
                f"{name}: spent {pool.spent} != Σ settled since the period began {settled.get(pool.pk, 0)}"
            )
        if held.get(pool.pk, 0) != pool.reserved:
            problems.append(f"{name}: reserved {pool.reserved} != Σ held reservations {held.get(pool.pk, 0)}")
        if pool.spent < 0 or pool.reserved < 0:
            problems.append(f"{name}: negative balance (spent {pool.spent}, reserved {pool.reserved})")
    return problems
