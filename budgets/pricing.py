"""Usage x price -> micro-dollars, and the worst case of one iteration.

Pure: integer and Decimal arithmetic only, no Django, no clock, no I/O. Costs round
up to the next micro-dollar (the platform never under-counts). Two entry points the
runner calls, `estimate_iteration(run)` and `usage_cost(usage)`, need the price table
and settings; they delegate to `budgets.selectors`, imported when called, so this module
stays importable (and testable) without Django.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Protocol

MICROS_PER_USD = 1_000_000
# A conservative characters-per-token ratio for estimating prompt size before a call.
CHARS_PER_TOKEN = 3


class UsageLike(Protocol):
    """What `instances.brains.base.Usage` provides."""

    @property
    def model(self) -> str: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...
    @property
    def cache_read_tokens(self) -> int: ...
    @property
    def cost_micros(self) -> int | None: ...


class RatesLike(Protocol):
    """USD per million tokens; `budgets.models.Price` and `Rates` both provide it."""

    @property
    def input_usd_per_mtok(self) -> Decimal: ...
    @property
    def output_usd_per_mtok(self) -> Decimal: ...
    @property
    def cache_write_usd_per_mtok(self) -> Decimal: ...
    @property
    def cache_read_usd_per_mtok(self) -> Decimal: ...


@dataclass(frozen=True)
class Rates:
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    cache_write_usd_per_mtok: Decimal
    cache_read_usd_per_mtok: Decimal


def usd_to_micros(value: Decimal | str | int | float) -> int:
    """Return `value` dollars as micro-dollars, rounded half up; ValueError if not a finite number."""
    if isinstance(value, bool):
        raise ValueError(f"not an amount of money: {value!r}")
    try:
        dollars = Decimal(str(value).strip()) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        raise ValueError(f"not an amount of money: {value!r}") from None
    if not dollars.is_finite():
        raise ValueError(f"not an amount of money: {value!r}")
    return int((dollars * MICROS_PER_USD).to_integral_value(rounding=ROUND_HALF_UP))


def micros_to_usd(micros: int) -> Decimal:
    """Return micro-dollars as an exact Decimal amount of dollars."""
    return Decimal(micros) / MICROS_PER_USD


def format_usd(micros: int | None) -> str:
    """Return "$1.25", "$0.000125" or "unlimited" for display; never rounds money away."""
    if micros is None:
        return "unlimited"
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    digits = f"{frac:06d}".rstrip("0")
    if len(digits) < 2:
        digits = digits.ljust(2, "0")
    return f"{sign}${whole:,}.{digits}"


def _ceil_micros(total: Decimal) -> int:
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def cost_micros(usage: UsageLike, price: RatesLike | None) -> int:
    """Return what `usage` cost in micro-dollars.

    A usage that carries `cost_micros` is already priced (a command reported `cost_usd`)
    and is returned as is. Otherwise each token class is priced at its rate; USD per
    million tokens is exactly micro-dollars per token, so the sum is rounded up once.
    """
    if usage.cost_micros is not None:
        if usage.cost_micros < 0:
            raise ValueError(f"a cost cannot be negative: {usage.cost_micros}")
        return usage.cost_micros
    counts = (usage.input_tokens, usage.output_tokens, usage.cache_write_tokens, usage.cache_read_tokens)
    if any(count < 0 for count in counts):
        raise ValueError(f"token counts cannot be negative: {counts}")
    if not any(counts):
        return 0
    if price is None:
        raise ValueError(f"no price for model {usage.model!r}")
    total = (
        usage.input_tokens * Decimal(price.input_usd_per_mtok)
        + usage.output_tokens * Decimal(price.output_usd_per_mtok)
        + usage.cache_write_tokens * Decimal(price.cache_write_usd_per_mtok)
        + usage.cache_read_tokens * Decimal(price.cache_read_usd_per_mtok)
    )
    return _ceil_micros(total)


def tokens_for_chars(chars: int) -> int:
    """Return a generous token count for a prompt of `chars` characters."""
    return math.ceil(max(chars, 0) / CHARS_PER_TOKEN)


def worst_case_call_micros(
    price: RatesLike, *, input_tokens: int, max_output_tokens: int, calls: int = 1
) -> int:
    """Return the most `calls` chained model calls can cost.

    Call k (from 0) re-sends the context plus every earlier call's full output, and every
    input token is priced at the dearer of the input and cache-write rates.
    """
    if input_tokens < 0 or max_output_tokens < 0 or calls < 0:
        raise ValueError("token counts and calls cannot be negative")
    input_rate = max(Decimal(price.input_usd_per_mtok), Decimal(price.cache_write_usd_per_mtok))
    sent = calls * input_tokens + max_output_tokens * calls * (calls - 1) // 2
    total = sent * input_rate + calls * max_output_tokens * Decimal(price.output_usd_per_mtok)
    return _ceil_micros(total)


def estimate_iteration(run: Any) -> int:
    """Return the micro-dollars to reserve for one iteration of `run` (its worst case)."""
    from budgets import selectors

    return selectors.estimate_iteration(run)


def usage_cost(usage: UsageLike) -> int:
    """Return what `usage` cost, priced from the price table (see `selectors.usage_cost`)."""
    from budgets import selectors

    return selectors.usage_cost(usage)
