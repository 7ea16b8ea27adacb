"""Money: dollars to and from integer micro-dollars, the one way Tether converts them.

Pure: Decimal and integer arithmetic only, no Django, no floats in the arithmetic. Tether
keeps every amount as integer micro-dollars ($1 = 1,000,000). Converting dollars rounds in
one direction only, up (toward +infinity), so a cost is never under-counted; a caller that
takes an amount a person typed (a cap, a limit) asks for `exact=True`, which refuses more
than six decimal places instead of rounding. Amounts are bounded by `MAX_USD`, so they fit
every integer column and every Decimal context they meet.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation, localcontext

MICROS_PER_USD = 1_000_000
MAX_USD = Decimal(10) ** 10  # ten billion dollars: 10**16 micro-dollars, far inside a signed 64-bit integer
MAX_MICROS = int(MAX_USD) * MICROS_PER_USD
_MAX_TEXT = 64
_GROUPED = re.compile(r"\d{1,3}(,\d{3})+(\.\d*)?")
_SIX_PLACES = Decimal("0.000001")


class MoneyError(ValueError):
    """A value that is not an acceptable amount of dollars; the message says why, for a person."""


def parse_usd(value: Decimal | str | int | float) -> Decimal:
    """Return `value` as an exact Decimal number of dollars; MoneyError if it is not a finite amount.

    Accepts a Decimal, an int, a float (read as its shortest repr, i.e. what was typed in
    JSON), or text such as "2.50", "$1,234.50" (thousands grouped by threes) or "-$0.50".
    """
    if isinstance(value, bool) or not isinstance(value, Decimal | str | int | float):
        raise MoneyError(f"not an amount of dollars: {value!r}")
    if isinstance(value, Decimal):
        dollars = value
    elif isinstance(value, int):
        dollars = Decimal(value)
    else:
        dollars = _decimal_from_text(repr(value) if isinstance(value, float) else value)
    if not dollars.is_finite():
        raise MoneyError(f"not an amount of dollars: {value!r}")
    if abs(dollars) > MAX_USD:
        raise MoneyError(f"{value!r} is more than Tether counts (at most ${MAX_USD:,} in one amount)")
    return dollars


def _decimal_from_text(text: str) -> Decimal:
    raw = text.strip()
    if not raw or len(raw) > _MAX_TEXT:
        raise MoneyError(f"not an amount of dollars: {text!r}")
    sign = ""
    if raw[0] in "+-":
        sign, raw = raw[0], raw[1:]
    raw = raw.removeprefix("$")
    if "," in raw:
        if not _GROUPED.fullmatch(raw):
            raise MoneyError(f"not an amount of dollars: {text!r} (write 1234.50 or 1,234.50)")
        raw = raw.replace(",", "")
    if "_" in raw or not raw or raw[0] in "+-":
        raise MoneyError(f"not an amount of dollars: {text!r}")
    try:
        return Decimal(sign + raw)
    except InvalidOperation:
        raise MoneyError(f"not an amount of dollars: {text!r}") from None


def usd_to_micros(
    value: Decimal | str | int | float, *, exact: bool = False, allow_negative: bool = False
) -> int:
    """Return `value` dollars as integer micro-dollars, rounded up to the next micro-dollar.

    `exact=True` refuses an amount with more than six decimal places (MoneyError) instead of
    rounding it: a cap of $0.0000001 is refused, never turned into a $0 or $0.000001 cap.
    A negative amount is refused unless `allow_negative`.
    """
    dollars = parse_usd(value)
    if dollars < 0 and not allow_negative:
        raise MoneyError(f"an amount of dollars cannot be negative; got {value}")
    with localcontext() as ctx:
        ctx.prec = len(dollars.as_tuple().digits) + 20  # every digit kept: the product is exact
        micros = dollars.scaleb(6)
        whole = micros.to_integral_value(rounding=ROUND_CEILING)
    if exact and whole != micros:
        raise MoneyError(
            f"{value} has more than six decimal places; Tether counts money in millionths of a dollar"
        )
    return int(whole)


def micros_to_decimal(micros: int) -> Decimal:
    """Return micro-dollars as an exact Decimal number of dollars with six decimal places."""
    with localcontext() as ctx:
        ctx.prec = len(str(abs(int(micros)))) + 10
        return (Decimal(int(micros)) / MICROS_PER_USD).quantize(_SIX_PLACES)


def usd_string(micros: int) -> str:
    """Return micro-dollars as plain exact dollars for JSON, events and receipts: "1.250000"."""
    return str(micros_to_decimal(micros))


def format_usd(micros: int | None) -> str:
    """Return "$1.25", "$0.000125", "$1,234.50" or "unlimited" (None) for people; never rounds money away."""
    if micros is None:
        return "unlimited"
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}${whole:,}.{digits}"
