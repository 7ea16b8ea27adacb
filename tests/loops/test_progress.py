"""Progress from a check's own output: real outputs of pytest, unittest, ruff, mypy and eslint.

The files in progress_samples/ are what those tools printed (paths shortened), kept as they are.
"""

from pathlib import Path

import pytest

from loops import progress

SAMPLES = Path(__file__).parent / "progress_samples"


@pytest.mark.parametrize(
    ("sample", "left"),
    [
        ("pytest_failing.txt", 2),  # ===== 2 failed, 1 passed in 0.24s =====
        ("pytest_q_error.txt", 2),  # 1 failed, 1 passed, 1 error in 0.27s (-q)
        ("pytest_collection_error.txt", 1),  # Interrupted: 1 error during collection
        ("pytest_passing.txt", 0),
        ("unittest_failing.txt", 2),  # FAILED (failures=1, errors=1)
        ("unittest_passing.txt", 0),  # Ran 1 test ... OK
        ("ruff_failing.txt", 4),  # Found 4 errors.
        ("ruff_clean.txt", 0),  # All checks passed!
        ("mypy_failing.txt", 2),  # Found 2 errors in 1 file (checked 1 source file)
        ("mypy_clean.txt", 0),  # Success: no issues found in 1 source file
        ("eslint_failing.txt", 3),  # ✖ 4 problems (3 errors, 1 warning): the errors
        ("eslint_one.txt", 1),
    ],
)
def test_each_tools_summary_is_read_from_its_real_output(sample, left):
    assert progress.measure((SAMPLES / sample).read_text()) == left


def test_the_documented_line_wins_and_the_last_one_counts():
    out = (SAMPLES / "pytest_failing.txt").read_text() + "TETHER_PROGRESS: 9\nTETHER_PROGRESS: 5\n"
    assert progress.measure(out) == 5
    assert progress.measure("step 3\n  TETHER_PROGRESS = 0\n") == 0


def test_several_tools_in_one_check_add_up():
    out = (SAMPLES / "ruff_failing.txt").read_text() + (SAMPLES / "pytest_failing.txt").read_text()
    assert progress.measure(out) == 6


def test_the_last_summary_of_a_tool_counts_and_colour_codes_are_ignored():
    out = "3 failed, 1 passed in 0.1s\nrerun\n\x1b[31m1 failed\x1b[0m, 3 passed in 0.2s\n"
    assert progress.measure(out) == 1


@pytest.mark.parametrize(
    "out",
    [
        "",
        "all good\n",
        "Found some errors.\n",
        "TETHER_PROGRESS: many\n",
        "I fixed 3 failed tests in 2s of work",
    ],
)
def test_output_without_a_summary_measures_nothing(out):
    assert progress.measure(out) is None


def test_a_check_records_zero_for_a_silent_pass_and_nothing_when_it_timed_out():
    assert progress.of_check("ok\n", passed=True) == 0
    assert progress.of_check("boom\n", passed=False) is None
    assert progress.of_check("7 failed in 1.0s\n", passed=False, timed_out=True) is None
    assert progress.of_check("7 failed in 1.0s\n", passed=False) == 7


def test_an_iteration_adds_its_checks_and_is_unknown_if_any_is():
    assert progress.total([2, 3]) == 5
    assert progress.total([2, None]) is None
    assert progress.total([]) is None
    assert progress.total([True, 1]) is None  # not a count (stored data of another shape)


def test_a_timed_out_check_in_the_sandbox_records_no_progress(tmp_path, script, settings):
    """A slow check says nothing about progress: it is never counted as stuck."""
    import threading

    from loops import checks

    slow = script("print('7 failed, 1 passed in 0.1s', flush=True)\ntime.sleep(30)\n")
    fast = script("print('7 failed, 1 passed in 0.1s')\nsys.exit(1)\n")
    found = checks.run_checks(
        [{"name": "slow", "command": slow, "timeout": 1}, {"name": "fast", "command": fast}],
        tmp_path,
        threading.Event(),
    )
    assert [(c.name, c.passed, c.progress) for c in found] == [("slow", False, None), ("fast", False, 7)]
    assert checks.as_json(found)[1]["progress"] == 7
