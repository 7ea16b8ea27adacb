"""The harnesses refuse a bad flag with a usage error naming it, before they start anything."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench.load", "--db-pool", "-1"], "--db-pool must be 0 (no pool) or more, got -1"),
        (["bench.load", "--clusters", "0"], "--clusters must be 1 or more, got 0"),
        (["bench.ledger_bench", "--lease-usd", "lots"], "--lease-usd must be an amount of dollars"),
        (["bench.tracing_bench", "--runs", "0"], "--runs must be 1 or more"),
    ],
)
def test_a_bad_flag_is_a_usage_error(argv, said):
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
