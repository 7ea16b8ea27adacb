"""What an agent controls (its output, its usage report, the files its checks run) never crashes its run.

The workspace's code runs inside each check (a check runs the agent's tests), and may write what
it likes where the evidence plugin writes its reports: an odd report is no evidence, not an error.
"""

import pytest

from loops.models import Event, Run

pytestmark = pytest.mark.django_db(transaction=True)

# What the agent leaves for the check to run: a "test report" whose counts are not counts.
ODD_REPORTS = [
    {"complete": True, "collected": ["t::a"], "outcomes": {"t::a": "passed"}, "deselected": "all of them"},
    {"complete": True, "collected": ["t::a"], "outcomes": {"t::a": "passed"}, "deselected": [1, 2]},
    {"complete": True, "collected": ["t::a"], "outcomes": {"t::a": "passed"}, "deselected": 1e308 * 10},
]


@pytest.mark.parametrize("report", ODD_REPORTS)
def test_an_odd_report_from_the_agents_code_is_no_evidence_and_the_run_goes_on(
    user, make_instance, script, start, drive, report
):
    import json

    impl = (
        "import os, pathlib\n"
        f"pathlib.Path(os.environ['TETHER_EVIDENCE_DIR'], 'forged.json').write_text({json.dumps(report)!r})\n"
        "print('TETHER_PROGRESS: 999999999999')\n"
    )
    usage = '{"model": [1], "input_tokens": "9", "cost_usd": {}}'
    agent = script(
        f"pathlib.Path('impl.py').write_text({impl!r})\n"
        f"pathlib.Path(os.environ['TETHER_USAGE_FILE']).write_text({usage!r})\n"
        "sys.stdout.write('odd \\x00 output')\n"
    )
    check = script("exec(compile(pathlib.Path('impl.py').read_text(), 'impl.py', 'exec'))\n")
    inst = make_instance(
        user, command=agent, max_iterations=2, checks=[{"name": "tests", "command": check, "required": True}]
    )
    run = drive(start(inst))
    assert run.status != Run.Status.RUNNING and run.outcome != Run.Outcome.CRASHED, run.outcome_detail
    checks = Event.objects.filter(run=run, kind="checks.finished").order_by("seq").first().data["checks"]
    assert checks[0]["passed"] is False
    assert "deselected" in checks[0]["evidence_detail"], checks[0]
    assert Event.objects.filter(run=run, kind="act.finished").exists()


@pytest.mark.parametrize(
    "report",
    [{"collected": 5, "deselected": "x"}, {"collected": ["t::a", 7], "deselected": [1]}, {"deselected": float("inf")}],
)
def test_an_odd_report_while_the_run_takes_its_baseline_counts_as_none(monkeypatch, tmp_path, report):
    import threading

    from loops import checks

    monkeypatch.setattr(checks, "_run", lambda *args: (None, [report]))
    baseline = checks.collect_baseline([{"name": "tests", "command": ["pytest", "-q"]}], tmp_path, threading.Event())
    assert baseline["tests"]["deselected"] == 0
    assert all(isinstance(nodeid, str) for nodeid in baseline["tests"]["collected"])
