"""Reads: where a run's money went, per iteration and per call, for the run page, the API and receipts.

No writes. A run's reservations are its money trail: call 0 of an iteration is the iteration's own
reservation (a command agent's self-reported spend), calls 1, 2, ... are metered model calls. A
page holds the latest `ITERATIONS` iterations that reserved anything (older ones on request, by
`before`), and at most `CALLS` call rows; the per-iteration totals are sums in the database, so
they stay right when a page leaves calls out. A page costs at most four queries, whatever the
size of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import BigIntegerField, Count, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from budgets import money
from budgets.models import LedgerEntry, Pool, Reservation
from budgets.selectors import ChainHeadroom

ITERATIONS = 10
CALLS = 300
TOKEN_KINDS = ("input", "output", "cache_write", "cache_read")
# An iteration's own reservation of nothing (a Claude iteration reserves per call instead): no money moved.
NOTHING = Q(call=0, amount=0) & (Q(actual=0) | Q(actual__isnull=True))


@dataclass(frozen=True)
class PaidBy:
    id: int
    name: str
    kind: str
    depth: int  # 0 for the root: a call's pools are listed root first


@dataclass(frozen=True)
class CallCost:
    """One reservation: a metered model call, or an iteration's reported spend (call 0)."""

    iteration: int
    call: int
    model: str
    input_tokens: int
    output_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    reserved: int
    settled: int | None
    overdraft: int
    status: str
    paid_by: list[PaidBy]
    over_limit: list[tuple[str, int]] = field(default_factory=list)  # (pool name, by how much) it overdrew

    @property
    def metered(self) -> bool:
        return self.call > 0

    @property
    def cause(self) -> str:
        """Return why this row overdrew its reservation, for people ("" when it did not)."""
        if not self.overdraft:
            return ""
        text = _cause(self.call, self.settled or 0, self.reserved)
        if self.over_limit:
            text += "; " + ", ".join(
                f"{name} went over its limit by {money.format_usd(by)}" for name, by in self.over_limit
            )
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "call": self.call,
            "kind": "metered" if self.metered else "reported",
            "model": self.model or None,
            "tokens": {
                "input": self.input_tokens,
                "output": self.output_tokens,
                "cache_write": self.cache_write_tokens,
                "cache_read": self.cache_read_tokens,
            },
            "status": self.status,
            "reserved_usd": money.usd_string(self.reserved),
            "reserved_micros": self.reserved,
            "settled_usd": None if self.settled is None else money.usd_string(self.settled),
            "settled_micros": self.settled,
            "overdraft_usd": money.usd_string(self.overdraft),
            "overdraft_micros": self.overdraft,
            "overdraft_cause": self.cause or None,
            "paid_by": [{"id": p.id, "name": p.name, "kind": p.kind} for p in self.paid_by],
        }


@dataclass(frozen=True)
class IterationCost:
    number: int
    cost: int  # settled so far
    reserved: int  # reserved by all its calls
    overdraft: int
    count: int  # its reservations, shown or not
    metered: int  # of which metered model calls
    calls: list[CallCost]

    @property
    def hidden(self) -> int:
        return self.count - len(self.calls)

    def as_json(self) -> dict[str, Any]:
        return {
            "iteration": self.number,
            "cost_usd": money.usd_string(self.cost),
            "cost_micros": self.cost,
            "reserved_usd": money.usd_string(self.reserved),
            "reserved_micros": self.reserved,
            "overdraft_usd": money.usd_string(self.overdraft),
            "overdraft_micros": self.overdraft,
            "calls_count": self.count,
            "metered_calls": self.metered,
            "calls": [c.as_json() for c in self.calls],
        }


@dataclass(frozen=True)
class RunSpending:
    """A page of a run's money trail, newest iteration first."""

    iterations: list[IterationCost]
    earlier: int | None  # the `before` that asks for the page of older iterations; None when there is none

    @property
    def overdrawn(self) -> bool:
        return any(it.overdraft for it in self.iterations)


def run_spending(
    run_id: int,
    *,
    before: int | None = None,
    chain: ChainHeadroom | None = None,
    iterations: int = ITERATIONS,
    calls: int = CALLS,
) -> RunSpending:
    """Return the money trail of the run's latest `iterations` iterations (those below `before`).

    `chain`, when the caller has the run's headroom already, names the pools without a query.
    """
    trail = Reservation.objects.filter(run_id=run_id).exclude(NOTHING)
    if before is not None:
        trail = trail.filter(iteration__lt=before)
    totals = list(
        trail.values("iteration")
        .annotate(
            cost=Sum("actual"),
            reserved=Sum("amount"),
            overdraft=Sum("overdraft"),
            count=Count("id"),
            metered=Count("id", filter=Q(call__gt=0)),
        )
        .order_by("-iteration")[: iterations + 1]
    )
    more = len(totals) > iterations
    totals = totals[:iterations]
    if not totals:
        return RunSpending(iterations=[], earlier=None)
    numbers = [row["iteration"] for row in totals]
    rows = list(
        Reservation.objects.filter(run_id=run_id, iteration__in=numbers)
        .exclude(NOTHING)
        .order_by("-iteration", "call", "id")
        .only("iteration", "call", "model", "usage", "amount", "actual", "overdraft", "status", "chain")[:calls]
    )
    pools = _pools({pk for r in rows for pk in r.chain}, chain)
    paying = _payers(rows, pools, chain)
    over = _over_limit([r for r in rows if r.overdraft], pools)
    by_iteration: dict[int, list[CallCost]] = {n: [] for n in numbers}
    for r in rows:
        by_iteration[r.iteration].append(_call(r, pools, over.get(r.pk, []), paying[r.pk]))
    return RunSpending(
        iterations=[
            IterationCost(
                number=row["iteration"],
                cost=row["cost"] or 0,
                reserved=row["reserved"] or 0,
                overdraft=row["overdraft"] or 0,
                count=row["count"],
                metered=row["metered"],
                calls=by_iteration[row["iteration"]],
            )
            for row in totals
        ],
        earlier=numbers[-1] if more else None,
    )


def _cause(call: int, settled: int, reserved: int) -> str:
    # Call 0 settles what a command agent reported about itself; a metered call cannot overdraw
    # (it is clamped to its reservation), so one that did was billed beyond it by the provider.
    who = "the agent reported" if call == 0 else "the provider billed"
    return f"{who} {money.format_usd(settled)} against {money.format_usd(reserved)} reserved"


def overdraft_cause(reservation: Reservation) -> str:
    """Return why `reservation` settled beyond what it reserved ("" when it did not)."""
    if not reservation.overdraft:
        return ""
    return _cause(reservation.call, reservation.actual or 0, reservation.amount)


def _pools(ids: set[int], chain: ChainHeadroom | None) -> dict[int, PaidBy]:
    known = {p.id: PaidBy(p.id, p.name, p.kind, depth) for depth, p in enumerate(chain.pools if chain else [])}
    missing = ids - known.keys()
    if missing:
        for pk, name, kind, path in Pool.objects.filter(pk__in=missing).values_list("pk", "name", "kind", "path"):
            known[pk] = PaidBy(pk, name, kind, path.strip("/").count("/"))
    return known


def _payers(rows: list[Reservation], pools: dict[int, PaidBy], chain: ChainHeadroom | None) -> dict[int, list[PaidBy]]:
    """Return, per reservation, the pools that pay for it, root first: its chain, and the ancestors a
    leased run pool in it draws on (its reservations hold money in the run pool alone)."""
    line = [p.id for p in chain.pools] if chain else []
    unknown = {pk for r in rows for pk in r.chain if pk not in line}
    paths = dict(Pool.objects.filter(pk__in=unknown).values_list("pk", "path")) if unknown else {}

    def up(pk: int) -> list[int]:
        if pk in line:
            return line[: line.index(pk) + 1]
        return [int(part) for part in paths.get(pk, f"/{pk}/").strip("/").split("/")]

    ids = {r.pk: {above for pk in r.chain for above in up(pk)} for r in rows}
    missing = set().union(*ids.values()) - pools.keys()
    if missing:
        pools.update(_pools(missing, None))
    return {
        r.pk: sorted((pools.get(pk, PaidBy(pk, f"pool {pk}", "", 0)) for pk in ids[r.pk]), key=lambda p: (p.depth, p.id))
        for r in rows
    }


def _over_limit(overdrawn: list[Reservation], pools: dict[int, PaidBy]) -> dict[int, list[tuple[str, int]]]:
    """Return, per overdrawn reservation, the pools its settlement took past their limit (from the ledger).

    Up the chain of a leased run pool the overdraft is booked through a lease slice, on entries
    naming the reservation's run and iteration.
    """
    if not overdrawn:
        return {}
    found: dict[int, list[tuple[str, int]]] = {}
    by_iteration = {(r.run_id, r.iteration): r.pk for r in overdrawn}
    entries = LedgerEntry.objects.filter(
        Q(reservation_id__in=[r.pk for r in overdrawn])
        | Q(
            run_id__in={r.run_id for r in overdrawn if r.run_id is not None},
            iteration__in={r.iteration for r in overdrawn},
            reservation__lease_for__isnull=False,
        ),
        kind=LedgerEntry.Kind.OVERDRAFT,
    ).order_by("pk")
    for reservation, pool, amount, run_id, iteration in entries.values_list(
        "reservation_id", "pool_id", "amount", "run_id", "iteration"
    ):
        owner = reservation if any(r.pk == reservation for r in overdrawn) else by_iteration.get((run_id, iteration))
        if owner is None:
            continue
        name = pools[pool].name if pool in pools else f"pool {pool}"
        found.setdefault(owner, []).append((name, amount))
    return found


def tokens_of(usage: Any) -> dict[str, int]:
    """Return a reservation's tokens by kind (`TOKEN_KINDS`), 0 for what it does not name."""
    found = {}
    for kind in TOKEN_KINDS:
        value = usage.get(f"{kind}_tokens") if isinstance(usage, dict) else None
        found[kind] = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    return found


def _call(
    r: Reservation, pools: dict[int, PaidBy], over_limit: list[tuple[str, int]], paid_by: list[PaidBy]
) -> CallCost:
    tokens = tokens_of(r.usage)
    return CallCost(
        iteration=r.iteration,
        call=r.call,
        model=r.model,
        input_tokens=tokens["input"],
        output_tokens=tokens["output"],
        cache_write_tokens=tokens["cache_write"],
        cache_read_tokens=tokens["cache_read"],
        reserved=r.amount,
        settled=r.actual,
        overdraft=r.overdraft,
        status=r.status,
        paid_by=paid_by,
        over_limit=over_limit,
    )


def spending_by_model(run_id: int) -> list[dict[str, Any]]:
    """Return the run's reservations summed per model (calls, tokens, cost, overdraft), for its receipt.

    One query. An iteration's reported spend (call 0) has no model: it is the row with `model` None.
    """
    tokens = {name: Sum(Cast(KT(f"usage__{name}_tokens"), BigIntegerField())) for name in TOKEN_KINDS}
    rows = (
        Reservation.objects.filter(run_id=run_id)
        .values("model")
        .annotate(calls=Count("id"), cost=Sum("actual"), overdraft=Sum("overdraft"), **tokens)
        .order_by("model")
    )
    return [
        {
            "model": row["model"] or None,
            "calls": row["calls"],
            "tokens": {name: row[name] or 0 for name in TOKEN_KINDS},
            "cost_usd": money.usd_string(row["cost"] or 0),
            "overdraft_usd": money.usd_string(row["overdraft"] or 0),
        }
        for row in rows
    ]
