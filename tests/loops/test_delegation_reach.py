"""No more reach than the parent, tools included; a refused delegate call is its own tool_result, at once.

The lead is a Claude-brain run scripted by the local Messages API (`tests.fakes.messages_server`).
"""

import pytest

from instances.models import AgentTemplate
from loops import delegation, services
from loops.models import Run
from tests.fakes.messages_server import text, tool_uses
from tests.loops import test_delegation as delegation_tests
from tests.loops.conftest import drive_in_thread
from tests.loops.test_delegation import children_of, tool_results

family, server = delegation_tests.family, delegation_tests.server  # a lead (write_file, delegate), helper, model

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shell(family):
    """A template whose agent has a shell: what the lead (write_file and delegate only) does not have."""
    return AgentTemplate.objects.create(
        name="shell", description="has run_command", brain="anthropic", model="claude-test-1",
        tools=["run_command"], decider="checks", max_iterations=2,
    )


def vet(run, to, **more):
    return delegation.check_call(run, {"to": to, "objective": "do it", "max_cost_usd": 0.10, **more}, [])


def test_a_lead_without_run_command_cannot_delegate_to_a_template_with_it(user, family, shell, server):
    server.enqueue(tool_uses([("delegate", {"to": "shell", "objective": "run it", "max_cost_usd": 0.10}, "sh")]),
                   text("I cannot; I will do it another way."))
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    refused, said = tool_results(server.requests[1])["sh"]
    assert refused and "template shell has tools you do not (run_command)" in said, said
    assert "a delegate cannot reach more than you can" in said
    assert not Run.objects.filter(parent=run).exists()  # no run was made


def test_a_role_the_parents_own_template_declares_is_allowed(user, family, shell):
    family.template = AgentTemplate.objects.create(
        name="lead-with-shell-role", brain="anthropic", model="claude-test-1", tools=["write_file", "delegate"],
        roles={"runner": "shell"},
    )
    family.save(update_fields=["template"])
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    assert vet(run, "runner").to == "runner"  # composed so by the operator
    with pytest.raises(delegation.Refusal, match="has tools you do not"):
        vet(run, "shell")  # the same template by its name is not the role


def test_a_tool_the_parent_must_ask_for_cannot_be_had_without_asking(user, family, make_instance, script):
    family.approval_tools = ["write_file"]
    family.save(update_fields=["approval_tools"])
    make_instance(user, name="writer", brain="command", command=script("print('hi')"), tools=["write_file"])
    make_instance(user, name="asker", brain="command", command=script("print('hi')"), tools=["write_file"],
                  approval_tools=["write_file"])
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    with pytest.raises(delegation.Refusal, match="may call write_file without a person's approval, and you must ask"):
        vet(run, "writer")
    assert vet(run, "asker").to == "asker"


def test_mcp_tools_and_command_lists_cannot_widen_either(user, family, make_instance, script):
    family.mcp_servers = ["notes"]
    family.tools = ["write_file", "run_command", "delegate", "mcp__notes__search_*"]
    family.command_allow = ["pytest"]
    family.save(update_fields=["mcp_servers", "tools", "command_allow"])
    program = script("print('hi')")
    make_instance(user, name="all-notes", command=program, mcp_servers=["notes"], tools=[])
    make_instance(user, name="some-notes", command=program, mcp_servers=["notes"], tools=["mcp__notes__search_a"])
    make_instance(user, name="any-command", command=program, tools=["run_command"])
    make_instance(user, name="pytest-only", command=program, tools=["run_command"], command_allow=["pytest"])
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    with pytest.raises(delegation.Refusal, match="may call MCP tools you may not \\(every tool of notes\\)"):
        vet(run, "all-notes")
    assert vet(run, "some-notes").to == "some-notes"
    with pytest.raises(delegation.Refusal, match="outside your allow list \\(pytest\\)"):
        vet(run, "any-command")
    assert vet(run, "pytest-only").to == "pytest-only"


def test_a_refused_delegation_beside_an_accepted_sibling_is_its_tool_result_in_the_same_turn(
    user, family, shell, server
):
    server.enqueue(
        tool_uses([("delegate", {"to": "helper", "objective": "help with the report", "max_cost_usd": 0.20}, "ok"),
                   ("delegate", {"to": "shell", "objective": "run it", "max_cost_usd": 0.20}, "no"),
                   ("delegate", {"to": "helper", "objective": "too big", "max_cost_usd": 5}, "big")]),
        text("Waiting for the helper."),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    # The very next request of the same act answers every call: no child had to finish first.
    assert len(server.requests) == 2
    said = tool_results(server.requests[1])
    assert said["no"][0] and "has tools you do not (run_command)" in said["no"][1]
    assert said["big"][0] and "does not fit" in said["big"][1]
    assert not said["ok"][0] and said["ok"][1].startswith("accepted")
    (child,) = children_of(run)  # the accepted one starts once the act ends
    assert child.objective == "help with the report" and run.status == "waiting"
    assert run.delegation["refused"] == []  # nothing left to tell in the next instruction
