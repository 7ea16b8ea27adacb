"""Usage x price -> micro-dollars, and the worst case of model calls.

Pure: integer and Decimal arithmetic only, no Django, no clock, no I/O, and no import of
the price table (`budgets.selectors` looks prices up and calls in here). Costs round up to
the next micro-dollar (the platform never under-counts); dollars convert through
`budgets.money`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Protocol


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


class UnpricedModel(ValueError):
    """A model with no row in the price table: Tether refuses to guess what its calls cost."""

    def __init__(self, model: str, who: str = "") -> None:
        self.model = model
        self.field = "model"  # the setting that names the model, for a surface to point at
        what = f"{who} model {model!r}, which has no price" if who else f"Model {model!r} has no price"
        super().__init__(
            f"{what}, so Tether cannot cap what its calls cost. Add a price in the admin (/admin/ → Budgets "
            "→ Prices → Add: the model name or a prefix of it, and its USD per million tokens), or choose a "
            "priced model."
        )


@dataclass(frozen=True)
class Rates:
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    cache_write_usd_per_mtok: Decimal
    cache_read_usd_per_mtok: Decimal


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
        raise UnpricedModel(usage.model)
    total = (
        usage.input_tokens * Decimal(price.input_usd_per_mtok)
        + usage.output_tokens * Decimal(price.output_usd_per_mtok)
        + usage.cache_write_tokens * Decimal(price.cache_write_usd_per_mtok)
        + usage.cache_read_tokens * Decimal(price.cache_read_usd_per_mtok)
    )
    return _ceil_micros(total)


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

