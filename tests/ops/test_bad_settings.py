"""A bad setting in the environment stops Tether at start with what to fix, never a traceback later."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("TETHER_CONSOLE_STATES_PER_PASS", "0", "TETHER_CONSOLE_STATES_PER_PASS must be 1 or more, got 0"),
        ("TETHER_CONSOLE_STATES_PER_PASS", "many", "TETHER_CONSOLE_STATES_PER_PASS must be a whole number, got 'many'"),
        ("TETHER_DB_CONN_MAX_AGE", "abc", "TETHER_DB_CONN_MAX_AGE must be a whole number, got 'abc'"),
        ("TETHER_DB_POOL", "-1", "TETHER_DB_POOL must be 0 (no pool) or at least 32"),
        ("TETHER_DB_POOL", "10", "TETHER_DB_POOL must be 0 (no pool) or at least 32 (TETHER_CONNECTIONS_PER_WORKER"),
        ("TETHER_DB_POOL", "many", "TETHER_DB_POOL must be a whole number, got 'many'"),
        ("TETHER_STALL_ITERATIONS", "-1", "TETHER_STALL_ITERATIONS must be 0 (off) or more, got -1"),
        ("TETHER_STALL_ITERATIONS", "few", "TETHER_STALL_ITERATIONS must be a whole number, got 'few'"),
        ("TETHER_CONSOLE_TIMEOUT_SECONDS", "soon", "TETHER_CONSOLE_TIMEOUT_SECONDS must be a number, got 'soon'"),
        ("TETHER_CONSOLE_TIMEOUT_SECONDS", "-1", "TETHER_CONSOLE_TIMEOUT_SECONDS must be a positive number, got -1.0"),
        ("TETHER_DELEGATION_MAX_DEPTH", "deep", "TETHER_DELEGATION_MAX_DEPTH must be a whole number, got 'deep'"),
        ("TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS", "5m", "TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS must be a number"),
        ("TETHER_COMMAND_ITERATION_RESERVE_USD", "lots", "TETHER_COMMAND_ITERATION_RESERVE_USD must be an amount of"),
        ("TETHER_REVIEW_SAMPLE_PERCENT", "150", "TETHER_REVIEW_SAMPLE_PERCENT must be a number from 0 to 100, got 150"),
        ("TETHER_REVIEW_SAMPLE_PERCENT", "half", "TETHER_REVIEW_SAMPLE_PERCENT must be a number from 0 to 100"),
    ],
)
def test_a_bad_setting_is_refused_at_start_naming_it(name, value, said, tmp_path):
    env = {**os.environ, "TETHER_HOME": str(tmp_path), name: value, "DJANGO_SETTINGS_MODULE": "tether.settings"}
    if name in ("TETHER_DB_CONN_MAX_AGE", "TETHER_DB_POOL"):
        env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/unused"  # read only with PostgreSQL
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert said in done.stderr
