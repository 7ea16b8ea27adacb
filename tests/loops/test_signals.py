"""The loop tells the apps above it about a run through signals; it does not import them."""

import ast
from pathlib import Path

from loops import runner, signals
from loops.models import Run

RUNNER = Path(runner.__file__)


def imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_the_runner_does_not_import_reviews():
    assert not [name for name in imported_modules(RUNNER) if name.split(".")[0] == "reviews"]


def test_reviews_listens_to_every_run_signal():
    for signal in (signals.run_starting, signals.run_finished, signals.iteration_starting, signals.attempt_lost):
        assert signal.has_listeners(Run), signal
