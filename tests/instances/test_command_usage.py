"""What a command reports spending is read through the one money conversion: up, never down."""

import json

import pytest

from budgets.money import MAX_MICROS
from instances.brains.command import read_usage


@pytest.mark.parametrize(
    ("reported", "micros"),
    [
        ("0.05", 50_000),
        (0.05, 50_000),
        (0.0000001, 1),  # a sliver of a micro-dollar is a micro-dollar, not nothing
        ("1.2345671", 1_234_568),
        (0, 0),
        (-1, None),  # not a cost: the tokens are priced instead
        ("ten", None),
        (True, None),
        (1e400, MAX_MICROS),  # JSON's 1e400 is infinity: counted as the most Tether counts
        (10**30, MAX_MICROS),
    ],
)
def test_a_reported_cost_rounds_up_and_is_never_lost(tmp_path, reported, micros):
    path = tmp_path / "usage.json"
    path.write_text(json.dumps({"input_tokens": 10, "cost_usd": reported}).replace("Infinity", "1e400"))
    assert read_usage(path).cost_micros == micros


@pytest.mark.parametrize(
    ("reported", "counted"),
    [(10**30, 10**12), (10**12, 10**12), (True, 0), (-5, 0), (1e400, 0), ("9", 0), (1234, 1234)],
)
def test_a_reported_token_count_is_bounded_never_lost_and_never_a_crash(db, price, tmp_path, reported, counted):
    from budgets import metering

    path = tmp_path / "usage.json"
    path.write_text(json.dumps({"input_tokens": reported, "output_tokens": reported}).replace("Infinity", "1e400"))
    usage = read_usage(path)
    assert (usage.input_tokens, usage.output_tokens) == (counted, counted)
    metering.split_cost(usage, usage.metered_micros)  # priced without an overflow
