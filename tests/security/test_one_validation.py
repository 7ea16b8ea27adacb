"""One validation owns every input: the same bad value gets the same refusal on every surface.

REST (the route's schema), MCP for people (`start_run`, `continue_run`, `interject`), an act's own
MCP endpoint (`delegate`, as a `command` agent calls it) and the Claude brain's `delegate` tool all
check a run's objective, messages, cap, iteration count and wall clock with the types of
`loops.schemas`: each refusal below is compared with what the REST API answers for the same value,
and none is a 5xx, a traceback or an "Error executing tool" without the reason. On PostgreSQL
(`DATABASE_URL`) a NUL reaching the database would be a `psycopg.DataError`: it never gets there.
"""

import json
import threading

import anyio
import pytest
from django.test import Client as DjangoClient
from mcp import Client

from budgets import metering
from instances import gateway
from loops import services
from loops.models import Run
from tests.fakes.messages_server import text, tool_uses
from tests.loops import test_delegation as delegation_tests
from tests.loops.conftest import drive_in_thread
from web import mcp_act
from web.auth import make_token
from web.mcp_server import build_server, stdio_caller

family, server = delegation_tests.family, delegation_tests.server  # a Claude lead, its helper, its model

pytestmark = pytest.mark.django_db(transaction=True)

NUL = "a\x00b"
# (field, value): each refused by REST with a 400 naming the field.
NUMBERS = [
    ("max_cost_usd", True), ("max_cost_usd", False), ("max_cost_usd", 0.001), ("max_cost_usd", 2_000_000),
    ("max_cost_usd", -1), ("max_cost_usd", 0), ("max_cost_usd", "NaN"), ("max_cost_usd", "-Infinity"),
    ("max_cost_usd", "lots"), ("max_cost_usd", [1]),
    ("max_iterations", True), ("max_iterations", 0), ("max_iterations", -5), ("max_iterations", 10_001),
    ("max_iterations", 2.5), ("max_iterations", "5"),
]
MINUTES = [("max_minutes", True), ("max_minutes", 0), ("max_minutes", -1), ("max_minutes", 527_041)]
OBJECTIVES = [("objective", NUL), ("objective", "x" * 8001), ("objective", "y" * 100_000), ("objective", "   ")]
MESSAGES = [("message", NUL), ("message", "z" * 8001)]
START_ROWS = NUMBERS + MINUTES + OBJECTIVES
CONTINUE_ROWS = NUMBERS + MINUTES + MESSAGES
INTERJECT_ROWS = [*MESSAGES, ("message", "   ")]
DELEGATE_ROWS = NUMBERS + OBJECTIVES


def rest(user, method, path, body):
    answer = getattr(DjangoClient(), method)(
        f"/v1{path}", data=json.dumps(body), content_type="application/json",
        headers={"Authorization": f"Bearer {make_token(user)}"},
    )
    return answer.status_code, answer.json()


def mcp_for_people(user, tool, arguments):
    async def go():
        async with Client(build_server(stdio_caller(user.pk))) as client:
            result = await client.call_tool(tool, arguments)
            return result.is_error, result.content[0].text if result.content else ""

    return anyio.run(go)


def clean(said):
    assert "Error executing tool" not in said and "Traceback" not in said and "DataError" not in said, said
    return said


def finished_run(user, lead):
    run = services.run_start(instance=lead, user=user, objective="o")
    return services.run_cancel(run=run, user=user)


@pytest.mark.parametrize(("field", "value"), START_ROWS, ids=lambda v: repr(v)[:20])
def test_start_run_over_mcp_answers_what_rest_answers(user, family, field, value):
    body = {"objective": "o", field: value}
    status, answer = rest(user, "post", f"/instances/{family.pk}/loop", body)
    assert status == 400 and answer["error"], answer
    refused, said = mcp_for_people(user, "start_run", {"instance": family.pk, **body})
    assert refused and clean(said) == answer["error"]
    assert not Run.objects.exists()


@pytest.mark.parametrize(("field", "value"), CONTINUE_ROWS, ids=lambda v: repr(v)[:20])
def test_continue_run_over_mcp_answers_what_rest_answers(user, family, field, value):
    old = finished_run(user, family)
    body = {field: value}
    status, answer = rest(user, "post", f"/instances/{family.pk}/loop/{old.pk}/continue", body)
    assert status == 400 and answer["error"], answer
    refused, said = mcp_for_people(user, "continue_run", {"run_id": old.pk, **body})
    assert refused and clean(said) == answer["error"]
    assert Run.objects.count() == 1


@pytest.mark.parametrize(("field", "value"), INTERJECT_ROWS, ids=lambda v: repr(v)[:20])
def test_interject_over_mcp_answers_what_rest_answers(user, family, field, value):
    live = services.run_start(instance=family, user=user, objective="o")
    status, answer = rest(user, "post", f"/instances/{family.pk}/loop/{live.pk}/interject", {field: value})
    assert status == 400 and answer["error"], answer
    refused, said = mcp_for_people(user, "interject", {"run_id": live.pk, field: value})
    assert refused and clean(said) == answer["error"]
    assert not live.interjections.exists()


def test_a_wall_clock_rest_accepts_mcp_accepts_too(user, family):
    status, answer = rest(user, "post", f"/instances/{family.pk}/loop", {"objective": "o", "max_minutes": 527_000})
    assert status == 201, answer
    refused, said = mcp_for_people(user, "start_run", {"instance": family.pk, "objective": "o", "max_minutes": 527_000})
    assert not refused, said


def delegate_arguments(field, value):
    return {"to": "helper", "objective": "help", "max_cost_usd": 0.10, field: value}


def act_mcp_delegate(run, lead, arguments):
    """Call `delegate` on the act's own MCP endpoint with the act's token, as a command agent does."""
    meter = metering.RunMeter(run, 1)
    with gateway.open_act(lead, run_id=run.pk, iteration=1, meter=meter, stop=threading.Event(), delegation=True) as act:
        assert act is not None
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "delegate", "arguments": arguments}}).encode()
        answer = mcp_act.handle("POST", "/mcp", {
            "authorization": f"Bearer {act.token}", "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }, body)
    assert answer.status == 200, answer.body
    result = json.loads(answer.body)["result"]
    return result.get("isError", False), result["content"][0]["text"]


def test_both_delegate_surfaces_answer_what_rest_answers_for_a_run(user, family, server, settings):
    settings.TETHER_DELEGATION_MAX_CHILDREN = 100
    expected = {}
    for field, value in DELEGATE_ROWS:
        status, answer = rest(user, "post", f"/instances/{family.pk}/loop", {"objective": "o", field: value})
        assert status == 400, answer
        expected[(field, repr(value))] = answer["error"]
    assert not Run.objects.exists()

    # An act's MCP endpoint (a command agent's delegate), on a running run of the lead.
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    for field, value in DELEGATE_ROWS:
        refused, said = act_mcp_delegate(run, family, delegate_arguments(field, value))
        assert refused and clean(said) == expected[(field, repr(value))], (field, value, said)
    services.run_cancel(run=run, user=user)

    # The Claude brain's delegate tool: every refusal is its own call's tool_result, at once.
    calls = [("delegate", delegate_arguments(field, value), f"call{n}") for n, (field, value) in
             enumerate(DELEGATE_ROWS)]
    server.enqueue(tool_uses(calls, usage={"output_tokens": 500}), text("I will do it myself."))
    lead = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    answered = delegation_tests.tool_results(server.requests[1])
    for n, (field, value) in enumerate(DELEGATE_ROWS):
        refused, said = answered[f"call{n}"]
        assert refused and clean(said) == "refused, and no run was made: " + expected[(field, repr(value))], said
    assert not Run.objects.filter(parent=lead).exists()
