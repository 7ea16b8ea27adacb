"""Pricing arithmetic: pure, exact, rounded up."""

import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgets.pricing import Rates, UnpricedModel, cost_micros, worst_case_call_micros

SONNET = Rates(Decimal("3"), Decimal("15"), Decimal("3.75"), Decimal("0.30"))
OPUS = Rates(Decimal("15"), Decimal("75"), Decimal("18.75"), Decimal("1.50"))
HAIKU = Rates(Decimal("1"), Decimal("5"), Decimal("1.25"), Decimal("0.10"))


@dataclass
class U:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cost_micros: int | None = None
    model: str = ""


@pytest.mark.parametrize(
    ("usage", "rates", "expected"),
    [
        (U(), SONNET, 0),
        (U(input_tokens=1_000_000), SONNET, 3_000_000),
        (U(output_tokens=1_000_000), SONNET, 15_000_000),
        (U(input_tokens=1000, output_tokens=500), SONNET, 3000 + 7500),
        (U(cache_write_tokens=1000), SONNET, 3750),
        (U(cache_read_tokens=1000), SONNET, 300),
        (U(input_tokens=1), SONNET, 3),
        (U(cache_read_tokens=1), SONNET, 1),  # 0.3 micro-dollars rounds up, never down
        (U(cache_read_tokens=10), SONNET, 3),
        (U(cache_read_tokens=11), SONNET, 4),  # 3.3 -> 4
        (U(input_tokens=2000, output_tokens=1000), OPUS, 30_000 + 75_000),
        (
            U(input_tokens=100, output_tokens=100, cache_write_tokens=100, cache_read_tokens=100),
            HAIKU,
            100 + 500 + 125 + 10,
        ),
        (U(input_tokens=10**9, output_tokens=10**9), OPUS, 90 * 10**9),
    ],
)
def test_cost_micros_prices_each_token_class(usage, rates, expected):
    assert cost_micros(usage, rates) == expected


@pytest.mark.parametrize("reported", [0, 1, 123_456, 10**12])
def test_a_usage_already_priced_is_taken_as_reported(reported):
    assert cost_micros(U(input_tokens=10**6, cost_micros=reported), OPUS) == reported
    assert cost_micros(U(cost_micros=reported), None) == reported


def test_tokens_without_a_price_are_an_error():
    with pytest.raises(UnpricedModel, match="Model 'mystery' has no price"):
        cost_micros(U(model="mystery", input_tokens=1), None)
    assert cost_micros(U(model="mystery"), None) == 0


@pytest.mark.parametrize("usage", [U(input_tokens=-1), U(cache_read_tokens=-5), U(cost_micros=-1)])
def test_negative_usage_is_refused(usage):
    with pytest.raises(ValueError):
        cost_micros(usage, SONNET)


@given(
    st.integers(0, 10**8),
    st.integers(0, 10**8),
    st.integers(0, 10**8),
    st.integers(0, 10**8),
    st.integers(0, 10**8),
)
def test_cost_is_the_exact_sum_rounded_up_and_additive_within_a_micro(i, o, w, r, extra):
    usage = U(i, o, w, r)
    exact = i * Decimal("3") + o * Decimal("15") + w * Decimal("3.75") + r * Decimal("0.30")
    cost = cost_micros(usage, SONNET)
    assert isinstance(cost, int)
    assert exact <= cost < exact + 1
    bigger = cost_micros(U(i + extra, o, w, r), SONNET)
    assert bigger >= cost


@pytest.mark.parametrize(
    ("rates", "input_tokens", "output", "calls", "expected"),
    [
        # one call: inputs at the dearer cache-write rate, outputs at the output rate
        (SONNET, 1000, 1000, 1, 3750 + 15_000),
        (SONNET, 0, 0, 1, 0),
        (SONNET, 1000, 1000, 0, 0),
        # two calls: the second re-sends the context plus the first call's output
        (SONNET, 1000, 1000, 2, (1000 + 2000) * 3.75 + 2000 * 15),
        (OPUS, 10_000, 8192, 3, (30_000 + 8192 * 3) * 18.75 + 3 * 8192 * 75),
    ],
)
def test_worst_case_call_micros(rates, input_tokens, output, calls, expected):
    got = worst_case_call_micros(rates, input_tokens=input_tokens, max_output_tokens=output, calls=calls)
    assert got == int(Decimal(str(expected)).to_integral_value(rounding="ROUND_CEILING"))


@given(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 10**5), st.integers(0, 10**5))
def test_the_worst_case_of_one_call_covers_any_usage_within_its_bounds(inp, out, write_part, read_part):
    # Any split of the prompt into plain, cache-written and cache-read tokens costs no more than the estimate.
    write, read = min(write_part, inp), min(read_part, max(inp - write_part, 0))
    usage = U(
        input_tokens=inp - write - read, output_tokens=out, cache_write_tokens=write, cache_read_tokens=read
    )
    for rates in (SONNET, OPUS, HAIKU):
        assert cost_micros(usage, rates) <= worst_case_call_micros(
            rates, input_tokens=inp, max_output_tokens=out
        )


def test_pricing_imports_nothing_from_django():
    code = "import sys, budgets.pricing; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


PURE_BUDGETS = {"budgets.pricing": "budgets/pricing.py", "budgets.money": "budgets/money.py"}
COMPUTATION = {"__future__", "dataclasses", "decimal", "math", "re", "typing", "budgets.money"}


@pytest.mark.parametrize("module", sorted(PURE_BUDGETS))
def test_pricing_and_money_import_only_computation_even_inside_functions(module):
    # Not even a lazy `from budgets import selectors` in a function body: the price table is looked
    # up by `budgets.selectors`, which calls in here, never the other way round.
    import ast

    source = (Path(__file__).resolve().parents[2] / PURE_BUDGETS[module]).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= COMPUTATION, f"{module} imports {sorted(imported - COMPUTATION)}"
