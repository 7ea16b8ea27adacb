"""Numbers an agent writes are refused as tool errors, and one run's fault never stalls the others.

The `delegate` call's numbers come from the model: whatever it sends (NaN, an infinity, 1e30,
a negative, a boolean, text) is a refusal it reads in its next instruction, never an exception
that leaves its run parked for good. And a pass of the heartbeat (the reaper, the stop sweep,
the parked parents' check) that fails on one run logs it once and goes on to the others.
"""

import json
import logging

import pytest

from loops import delegation, driver, lifecycle, services
from loops.models import Event, Run
from tests.fakes.messages_server import text, tool_use, tool_uses
from tests.loops import test_delegation as delegation_tests
from tests.loops.conftest import drive_in_thread
from tests.loops.test_delegation import children_of, delegate

family, server = delegation_tests.family, delegation_tests.server  # the fixtures: a lead, its helper, its model

pytestmark = pytest.mark.django_db(transaction=True)

BAD_BUDGETS = [1e30, "1e999", "nan", "inf", "-Infinity", -1, 0, True, "lots", None, [1]]
BAD_ITERATIONS = [-1, 0, True, 1e30, 10**30, "5"]
# The sentences a person gets from the REST API for the same values (one schema: `loops.schemas`).
BUDGET_REFUSED = "max_cost_usd must be a number of US dollars, like 2.50, from 0.01 to 1,000,000"
ITERATIONS_REFUSED = "max_iterations must be a whole number"


@pytest.fixture(autouse=True)
def _fresh_failures(monkeypatch):
    monkeypatch.setattr(driver, "_failing", set(), raising=False)


def park(run, calls):
    """Leave `run` parked with its delegate calls unstarted, as a worker that died after recording them does."""
    Run.objects.filter(pk=run.pk).update(status="waiting", delegation={
        "state": "starting", "iteration": 1, "instruction": run.objective, "calls": calls,
        "children": [], "refused": [],
    })


def call(id, **arguments):
    return {"name": "delegate", "id": id, "input": {"to": "helper", "objective": "help", **arguments}}


def test_an_agents_bad_numbers_are_refusals_it_reads_and_its_run_goes_on(user, family, server, settings):
    settings.TETHER_DELEGATION_MAX_CHILDREN = 20
    calls = [delegate("helper", "x", cost) for cost in BAD_BUDGETS]
    calls += [delegate("helper", "x", 0.10, max_iterations=n) for n in BAD_ITERATIONS]
    server.enqueue(
        tool_uses(calls),
        tool_use("write_file", {"path": "REPORT.md", "content": "fixed myself"}),
        text("Did it myself."),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="write the report",
                                             max_cost_usd="1.00"))
    assert children_of(run) == []
    # Each refusal is its own call's tool_result, in the same turn: the model read why and went on.
    said = json.dumps(server.requests[1].body["messages"][-1])
    assert said.count(BUDGET_REFUSED) == len(BAD_BUDGETS), said
    assert said.count(ITERATIONS_REFUSED) == len(BAD_ITERATIONS), said
    assert "1e+30 is more than Tether counts" in said
    assert "got 'nan'" in said and "got true/false" in said
    assert run.outcome == "done", run.outcome_detail


@pytest.mark.parametrize("cost", BAD_BUDGETS)
def test_a_bad_budget_during_an_act_is_a_refusal_the_mcp_tool_returns(user, family, cost):
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    with pytest.raises(delegation.Refusal, match=BUDGET_REFUSED):
        delegation.check_call(run, {"to": "helper", "objective": "x", "max_cost_usd": cost}, [])


def test_the_reaper_refuses_a_parked_call_with_a_huge_budget_and_resumes_the_parent(user, family):
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    park(run, [call("toolu_1", max_cost_usd=1e30)])
    driver.reap()
    run.refresh_from_db()
    assert children_of(run) == [] and run.status == "queued"
    assert "delegate call toolu_1 to 'helper' was refused: " + BUDGET_REFUSED in run.next_instruction


def test_a_parked_run_that_cannot_start_does_not_stop_the_reaper_starting_another(user, family, caplog):
    broken = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    good = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    park(broken, "not a list of calls")
    park(good, [call("toolu_1", max_cost_usd=0.10)])
    with caplog.at_level(logging.ERROR):
        driver.reap()
        driver.reap()
    (child,) = children_of(good)
    assert Run.objects.get(pk=good.pk).delegation["children"] == [child.pk]
    broken.refresh_from_db()
    assert (broken.status, broken.outcome) == ("finished", "crashed")
    assert "Tether failed to start the child runs" in broken.outcome_detail
    assert "AttributeError" in broken.outcome_detail and "worker's log" in broken.outcome_detail
    logged = [r for r in caplog.records if r.exc_info and f"run {broken.pk}:" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]


def test_one_run_the_reaper_fails_on_is_logged_once_and_the_others_are_reaped(user, family, monkeypatch, caplog):
    from datetime import timedelta

    from django.utils import timezone

    first = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    second = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    real = lifecycle.record_lost_attempt

    def record(run, worker, changes):
        if run.pk == first.pk:
            raise RuntimeError("a fault in this run's rows")
        return real(run, worker, changes)

    monkeypatch.setattr(lifecycle, "record_lost_attempt", record)
    with caplog.at_level(logging.ERROR):
        driver.reap()
        driver.reap()
    assert Event.objects.filter(run=second, kind="run.reaped").count() == 1
    assert not Event.objects.filter(run=first, kind="run.reaped").exists()
    logged = [r for r in caplog.records if r.exc_info and f"run {first.pk}:" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]


def test_one_stopped_run_the_sweep_fails_on_does_not_keep_the_others_running(user, family, monkeypatch):
    from django.utils import timezone

    from loops import liveness

    first = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    second = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(
        status="running", lease_token="t", lease_holder="dead-host:1", cancel_requested_at=timezone.now()
    )
    real = lifecycle.finish_stopped

    def finish(run_id, token, holder):
        if run_id == first.pk:
            raise RuntimeError("a fault in this run's rows")
        return real(run_id, token, holder)

    monkeypatch.setattr(liveness, "holder_gone", lambda holder: True)
    monkeypatch.setattr(lifecycle, "finish_stopped", finish)
    assert driver.sweep_stops() == 1
    assert Run.objects.get(pk=second.pk).outcome == "cancelled"
    assert Run.objects.get(pk=first.pk).status == "running"
