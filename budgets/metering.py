"""Metering: every model call reserves its worst case before it goes out and settles at its usage.

Moves money (through `budgets.ledger`). One `RunMeter` serves one iteration of one run; the
Claude brain's act turns and the `llm` decider call `before` just before each request and
`after` with the usage the provider returned. `before`:

- bounds the call's input from the request itself: every token covers at least one byte of
  the serialized request, so its UTF-8 length is a hard upper bound on input tokens, priced at
  the dearer of the input and cache-write rates;
- clamps `max_tokens` to what the run's headroom can still pay after that input;
- refuses (raises `BudgetExhausted`, naming the pool) when not even `min_tokens` of output
  fit: the call is not made;
- reserves the call's worst case up the run's pool chain (reservation `call` 1, 2, ...).

Because the reservation bounds the call's cost, settling never overdraws: for metered spend
`spent <= limit` holds for every pool at every moment. `after` settles at the real usage and
refunds the rest; `abandon` settles a call stopped in flight at what is known of it.

Runs in the worker, outside any transaction of the caller's (each ledger operation is its own),
so a transient database error (a connection cut while the model answered) is retried on a new
connection (`tether.dbfaults`) instead of failing the act.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from budgets import booking, ledger, money, pricing, selectors
from budgets.grants import BudgetExhausted, Grant
from tether import dbfaults


@dataclass(frozen=True)
class _Held:
    reservation: ledger.Held | None
    amount: int

class RunMeter:
    """Meter the model calls of one iteration of one run (or, with `pool`, calls made for no run)."""

    def __init__(self, run: Any, iteration: int, *, min_tokens: int = 256, pool: Any = None) -> None:
        self.run = run
        self.pool = pool
        self.iteration = iteration
        self.min_tokens = min_tokens
        self.spent = 0  # micro-dollars settled for this iteration's calls so far
        self.reserved = 0  # micro-dollars reserved for them (what the iteration held at most)
        self._calls = 0
        self._lock = threading.Lock()

    def before(self, *, model: str, request_bytes: int, max_tokens: int) -> Grant:
        """Reserve one call's worst case; return the grant (with `max_tokens` clamped to the headroom)."""
        try:
            price = dbfaults.retry(lambda: selectors.price_for_model(model), what=f"meter: price of {model}")
        except pricing.UnpricedModel as exc:  # a price deleted mid-run: a call that cannot be metered is not made
            raise BudgetExhausted(f"{exc}; a call that cannot be metered is not made") from None
        input_rate = max(Decimal(price.input_usd_per_mtok), Decimal(price.cache_write_usd_per_mtok))
        output_rate = Decimal(price.output_usd_per_mtok)
        fixed = Decimal(max(request_bytes, 0)) * input_rate
        headroom = self._headroom().remaining
        needed = min(max_tokens, self.min_tokens)
        if headroom is not None and output_rate > 0:
            affordable = int((Decimal(headroom) - fixed) / output_rate)
            max_tokens = min(max_tokens, affordable)
        if max_tokens < needed or max_tokens <= 0:
            limiting = self._headroom().limiting
            name = limiting.name if limiting else (f"run {self.run.pk}" if self.run is not None else "the pool")
            raise BudgetExhausted(
                f"{name} cannot pay for another call to {model}: it has {money.format_usd(headroom)} left and "
                f"one call needs at least {money.format_usd(_ceil(fixed + needed * output_rate))}"
            )
        # Every request byte counted as a token at the dearer input rate: the most the call can cost.
        amount = pricing.worst_case_call_micros(price, input_tokens=max(request_bytes, 0), max_output_tokens=max_tokens)
        with self._lock:
            self._calls += 1
            call = self._calls
        try:
            # Idempotent per (run, iteration, call): a retry after a cut returns the same reservation.
            reservation = dbfaults.retry(
                lambda: ledger.hold(
                    run=self.run,
                    iteration=self.iteration,
                    call=call,
                    model=model,
                    amount=amount,
                    pool=self.pool,
                ),
                what=f"meter: reserve call {call}",
            )
        except booking.BudgetRefused as refused:  # another call took the headroom meanwhile
            raise BudgetExhausted(refused.detail) from None
        with self._lock:
            self.reserved += amount
        return Grant(max_tokens, _Held(reservation, amount))

    def _headroom(self) -> selectors.ChainHeadroom:
        if self.run is None:
            return dbfaults.retry(lambda: selectors.headroom_for_pool(self.pool), what="meter: headroom")
        return dbfaults.retry(lambda: selectors.headroom_for_run(self.run), what="meter: headroom")

    def after(self, grant: Grant, usage: pricing.UsageLike) -> int:
        """Settle the call at the provider's usage (a failed call's: what is known of it); return its cost."""
        cost = selectors.usage_cost(usage)
        tokens = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "cache_read_tokens": usage.cache_read_tokens,
        }

        def close() -> None:  # settling is idempotent: a retry after a cut settles once
            ledger.settle(grant.handle.reservation, actual=cost, usage=tokens)

        dbfaults.retry(close, what="meter: settle a call")
        with self._lock:
            self.spent += cost
        return cost


def for_pool(pool: Any) -> RunMeter:
    """Return a meter charging model calls made for no run to `pool`'s chain (e.g. a user's pool)."""
    return RunMeter(None, 0, pool=pool)


def split_cost(usage: pricing.UsageLike, metered_micros: int) -> tuple[int, int]:
    """Return (what `usage` cost in all, the part no meter has settled yet).

    A usage from metered calls was settled call by call (`metered_micros`); only a reported
    cost (a command's own `cost_usd`) or unmetered tokens remain for the iteration to settle.
    """
    if usage.cost_micros is None and metered_micros:
        return metered_micros, 0
    unmetered = selectors.usage_cost(usage)
    return unmetered + metered_micros, unmetered


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING))
