"""Money: one conversion between dollars and micro-dollars, rounding up, exact on request."""

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgets.money import (
    MAX_MICROS,
    MAX_USD,
    MoneyError,
    format_usd,
    micros_to_decimal,
    usd_string,
    usd_to_micros,
)

MICROS = st.integers(0, MAX_MICROS)
# Dollar amounts as people and programs write them: up to ten decimal places, some with a "$".
DOLLARS = st.decimals(min_value=0, max_value=MAX_USD, places=10, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize(
    ("value", "micros"),
    [
        ("0", 0),
        ("0.05", 50_000),
        (Decimal("1.234567"), 1_234_567),
        ("1.2345671", 1_234_568),  # up, never down
        ("1.2345675", 1_234_568),
        ("0.0000001", 1),
        (3, 3_000_000),
        (0.1, 100_000),  # a float is read as it was written, not as its binary value
        (2.675, 2_675_000),
        (" 2.5 ", 2_500_000),
        ("$1,234.50", 1_234_500_000),
        ("1e-6", 1),
        ("1E3", 1_000_000_000),
    ],
)
def test_usd_to_micros_rounds_up(value, micros):
    assert usd_to_micros(value) == micros


@pytest.mark.parametrize(
    "value",
    ["", "ten", "NaN", "sNaN", "inf", "-Infinity", True, None, "1e", "2,50", "1_000", "$-1", "1e30",
     float("nan"), float("inf"), 10**11, [], "9" * 70],
)
def test_usd_to_micros_refuses_what_is_not_money(value):
    with pytest.raises(MoneyError):
        usd_to_micros(value)


def test_negative_amounts_are_refused_unless_asked_for():
    with pytest.raises(MoneyError, match="negative"):
        usd_to_micros("-1")
    assert usd_to_micros("-1", allow_negative=True) == -1_000_000
    assert usd_to_micros("-$0.50", allow_negative=True) == -500_000
    assert usd_to_micros("-0.0000001", allow_negative=True) == 0  # up is toward +infinity


@pytest.mark.parametrize("value", ["0.0000001", 1e-07, Decimal("2.0000005"), "0.1234567"])
def test_an_exact_amount_refuses_more_than_six_decimal_places(value):
    with pytest.raises(MoneyError, match="six decimal places"):
        usd_to_micros(value, exact=True)


@pytest.mark.parametrize(("value", "micros"), [("2.50", 2_500_000), ("0.000001", 1), ("1.2300000", 1_230_000)])
def test_an_exact_amount_keeps_six_decimal_places(value, micros):
    assert usd_to_micros(value, exact=True) == micros


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (None, "unlimited"),
        (0, "$0.00"),
        (50_000, "$0.05"),
        (1_250_000, "$1.25"),
        (125, "$0.000125"),
        (4_980_000, "$4.98"),
        (1_234_567_890_000, "$1,234,567.89"),
        (-500_000, "-$0.50"),
    ],
)
def test_format_usd(micros, text):
    assert format_usd(micros) == text


def test_usd_string_is_exact_with_six_places():
    assert usd_string(0) == "0.000000"
    assert usd_string(1_250_000) == "1.250000"
    assert usd_string(MAX_MICROS - 1) == "9999999999.999999"
    assert micros_to_decimal(7) == Decimal("0.000007")


@given(MICROS)
def test_every_format_reads_back_as_the_same_micros(micros):
    for text in (format_usd(micros), usd_string(micros), str(micros_to_decimal(micros))):
        assert usd_to_micros(text, exact=True) == micros
        assert usd_to_micros(text) == micros
    assert usd_to_micros(micros_to_decimal(micros), exact=True) == micros


@given(st.integers(-MAX_MICROS, MAX_MICROS))
def test_negative_formats_read_back_too(micros):
    assert usd_to_micros(format_usd(micros), allow_negative=True) == micros


@given(DOLLARS, st.booleans())
def test_a_cost_is_never_under_counted_and_never_over_by_a_micro(dollars, dollar_sign):
    text = f"${dollars}" if dollar_sign else str(dollars)
    micros = usd_to_micros(text)
    exact = dollars * 1_000_000
    assert exact <= micros < exact + 1
    assert micros_to_decimal(micros) >= dollars


@given(DOLLARS)
def test_exact_refuses_exactly_the_amounts_rounding_would_change(dollars):
    rounded = usd_to_micros(dollars)
    if rounded == dollars * 1_000_000:
        assert usd_to_micros(dollars, exact=True) == rounded
    else:
        with pytest.raises(MoneyError):
            usd_to_micros(dollars, exact=True)


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_a_float_is_read_as_its_shortest_repr(value):
    assert usd_to_micros(value) == usd_to_micros(repr(value))


def test_money_imports_nothing_from_django():
    code = "import sys, budgets.money; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"
