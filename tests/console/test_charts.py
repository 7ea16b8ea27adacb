"""The run page's SVG chart: pure, escaped, one column per iteration."""

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from web import charts


@pytest.mark.parametrize(
    ("checks", "state"),
    [
        ([], "none"),
        ([{"name": "a", "required": True, "passed": True}], "passed"),
        ([{"name": "a", "required": True, "passed": False}], "failed"),
        ([{"name": "a", "required": False, "passed": False}, {"name": "b", "passed": True}], "optional"),
        ([{"name": "a", "passed": False}], "failed"),  # required unless it says otherwise
    ],
)
def test_checks_state(checks, state):
    assert charts.checks_state(checks) == state


def iteration(number, cost, checks=(), ok=True, verdict="continue"):
    return SimpleNamespace(
        number=number, cost_micros=cost, checks=list(checks), act_ok=ok, decision={"verdict": verdict}
    )


def test_one_column_per_iteration_with_a_tooltip_and_a_summary():
    rows = [
        iteration(1, 1200, [{"name": "t", "required": True, "passed": False}]),
        iteration(2, 0, ok=False, verdict="failed"),
        iteration(3, 3600, [{"name": "t", "required": True, "passed": True}], verdict="done"),
    ]
    svg = charts.cost_and_checks(charts.points(rows), total_iterations=10)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('<g class="chart-col">') == 3
    assert "Iteration 1: $0.0012, a required check failed, decision continue" in svg
    assert "Iteration 2: $0, no checks, the act failed, decision failed" in svg
    assert "chart-check-passed" in svg and "chart-bar-failed" in svg
    assert "latest 3 of 10" in svg and "dearest $0.0036" in svg


def test_text_is_escaped_and_nothing_is_drawn_for_no_iterations():
    svg = charts.cost_and_checks(charts.points([iteration(1, 5, verdict='<script>"x"</script>')]))
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "No iterations yet" in charts.cost_and_checks([])


def test_the_chart_module_is_pure():
    tree = ast.parse(Path(charts.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    imported -= {"budgets.money"}  # pure as well (tests/budgets/test_money.py): the one way money is shown
    imported -= {"loops.progress"}  # pure as well (tests/loops/test_pure_imports.py): the one reader of a count
    assert not any(name.startswith(("django", "loops", "budgets", "instances")) for name in imported), (
        imported
    )


def test_the_progress_line_draws_what_the_checks_said_was_left():
    rows = [iteration(n, 10, checks=[{"name": "t", "required": True, "passed": False, "progress": left}])
            for n, left in ((1, 6), (2, None), (3, 3))]
    data = charts.points(rows)
    assert [p.progress for p in data] == [6, None, 3]
    svg = charts.cost_and_checks(data)
    assert svg.count('class="chart-progress-dot"') == 2 and 'class="chart-progress-line"' in svg
    assert "Left to fix by the checks&#x27; count: 6 after iteration 1, 3 after iteration 3." in svg
    assert "chart-progress" not in charts.cost_and_checks(charts.points([iteration(1, 10)]))
