"""Output kept whatever ends the act: an act the budget ends keeps what it printed and called in `act.finished`."""

import pytest

from loops.models import Event, Run
from tests.fakes.messages_server import text, tool_use
from tests.loops import test_delegation as delegation_tests
from tests.loops.conftest import drive_in_thread
from tests.security import test_gateway as gateway_tests

agent, no_ambient_keys, answer_with = gateway_tests.agent, gateway_tests.no_ambient_keys, gateway_tests.answer_with
server = gateway_tests.server

pytestmark = pytest.mark.django_db(transaction=True)

SPENDER = """
import anthropic
client = anthropic.Anthropic(max_retries=0)
for n in range(1, 50):
    try:
        client.messages.create(model="claude-test-1", max_tokens=4000, messages=[{"role": "user", "content": "work"}])
        print(f"CALL {n} -> 200", flush=True)
    except anthropic.APIStatusError as exc:
        print(f"CALL {n} -> {exc.status_code}", flush=True)
        break
"""


def test_the_gateway_spenders_lines_are_kept_when_the_budget_ends_its_act(agent, server):
    answer_with(server, 3000)
    inst = agent(SPENDER)
    run = drive_in_thread(gateway_tests.start(inst, cap="0.15"))
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED, run.outcome_detail
    finished = Event.objects.get(run=run, kind="act.finished").data
    assert "CALL 1 -> 200" in finished["response"] and "CALL 2 -> 200" in finished["response"], finished
    assert f"CALL {server.calls + 1} -> 402" in finished["response"]
    assert "CALL 1 -> 200" in run.iterations.get().response


def test_a_claude_act_the_budget_ends_keeps_what_it_said_and_ran(user, make_instance, script, price, settings):
    from instances.models import Credential
    from loops import services
    from tests.fakes.messages_server import MessagesServer

    with MessagesServer(api_key=delegation_tests.KEY) as messages:
        credential = Credential.create_for(user, label="k", secret=delegation_tests.KEY)
        lead = make_instance(
            user, name="writer", brain="anthropic", decider="checks", base_url=messages.url, credential=credential,
            model="claude-test-1", tools=["write_file"], command=[], checks=[], max_iterations=2,
        )
        lead.workspace_path().mkdir(parents=True, exist_ok=True)
        # The first turn writes a file and says so; the second cannot be paid for.
        messages.enqueue(tool_use("write_file", {"path": "notes.txt", "content": "x"}, say="Writing my notes.",
                                  usage={"output_tokens": 3000}), text("never asked"))
        run = drive_in_thread(services.run_start(instance=lead, user=user, objective="o", max_cost_usd="0.01"))
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED, run.outcome_detail
    finished = Event.objects.get(run=run, kind="act.finished").data
    assert "Writing my notes." in finished["response"], finished
    assert [c["name"] for c in finished["tool_calls"]] == ["write_file"]
