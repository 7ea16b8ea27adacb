"""Review sampling: deterministic under a seed, and matching the configured rate over many runs."""

import math
from decimal import Decimal

import pytest

from reviews import sampling

RUNS = 10_000


def drawn(percent, seed, ids=range(1, RUNS + 1)):
    return {run_id for run_id in ids if sampling.is_sampled(run_id, percent, seed)}


def test_the_same_seed_draws_the_same_runs():
    assert drawn(10, b"seed-a") == drawn(10, b"seed-a")


def test_another_seed_draws_other_runs():
    first, second = drawn(10, b"seed-a"), drawn(10, b"seed-b")
    assert first != second
    # Independent draws overlap about as much as chance says (10 % of 10 %), not wholesale.
    assert len(first & second) < 0.2 * len(first)


@pytest.mark.parametrize("percent", [10, Decimal("2.5"), 25, 50, Decimal("99.5")])
def test_the_share_drawn_matches_the_rate_over_ten_thousand_runs(percent):
    rate = float(percent) / 100
    expected = RUNS * rate
    sigma = math.sqrt(RUNS * rate * (1 - rate))
    got = len(drawn(percent, b"tether-sampling-test"))
    assert abs(got - expected) <= 4 * sigma, (got, expected, sigma)


def test_a_lower_rate_draws_a_subset_of_a_higher_one():
    # Raising a template's rate only adds runs to the sample; it never swaps them.
    assert drawn(5, b"s") <= drawn(10, b"s") <= drawn(40, b"s")


def test_zero_and_hundred_percent_are_exact():
    assert drawn(0, b"s") == set()
    assert drawn(100, b"s") == set(range(1, RUNS + 1))


def test_the_module_is_pure():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(sampling))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "hashlib", "decimal"}
