"""The runner reads as one iteration (issue #28): short, with short functions, one value carried through."""

import ast
import inspect
from pathlib import Path

from loops import runner

RUNNER = Path(runner.__file__)
MAX_LINES = 700  # the runner's whole file
MAX_FUNCTION_LINES = 80


def test_the_runner_fits_in_its_bound():
    assert len(RUNNER.read_text().splitlines()) < MAX_LINES


def test_no_function_of_the_runner_is_longer_than_its_bound():
    tree = ast.parse(RUNNER.read_text())
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert not long


def test_act_verify_decide_and_record_each_take_the_one_iteration_value():
    for step in (runner._act, runner._judged, runner._decide, runner._graders, runner._record):
        first = next(iter(inspect.signature(step).parameters.values()))
        assert first.annotation in ("Turn", runner.Turn), step.__name__
    assert runner.Turn.__dataclass_params__.frozen and hasattr(runner.Turn, "__slots__")
