"""A `command` agent delegates through its act's MCP endpoint, with the per-act token Tether gives it.

The agent is a scripted program in the sandbox speaking MCP with the `mcp` client SDK to
TETHER_MCP_URL (its loopback relay to the worker's gateway socket) with TETHER_TOKEN. The
runs are driven in this thread in turn, as workers would pick them up; the act's MCP endpoint
is served by this process's gateway socket, as a worker's would be.
"""

import json

import pytest

from budgets import selectors
from budgets.models import Pool, Reservation
from loops import services
from loops.models import Event, Run
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

# What every scripted agent below shares: an MCP session on its act's endpoint, and a way to
# record what each call answered (or why it was refused) in the workspace.
MCP = """
import asyncio, httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

def session(token=None):
    headers = {"Authorization": "Bearer " + (token or os.environ["TETHER_TOKEN"])}
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    return http, Client(streamable_http_client(os.environ["TETHER_MCP_URL"], http_client=http))

def describe(exc):
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    return type(exc).__name__ + ": " + str(exc)

async def call(client, tool, **arguments):
    try:
        result = await client.call_tool(tool, arguments)
    except Exception as exc:
        return {"raised": describe(exc)}
    text = result.content[0].text if result.content else ""
    return {"error": text} if result.is_error else {"ok": result.structured_content or json.loads(text)}
"""

LEAD = (
    MCP
    + """
instruction = sys.stdin.read()
seen = json.loads(pathlib.Path("seen.json").read_text()) if pathlib.Path("seen.json").exists() else {}

async def first_act():
    http, client = session()
    async with http, client:
        seen["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        seen["too_big"] = await call(client, "delegate", to="helper", objective="too big", max_cost_usd=5)
        seen["nobody"] = await call(client, "delegate", to="nobody", objective="who?", max_cost_usd=0.1)
        seen["helper"] = await call(client, "delegate", to="helper", objective="help with the report",
                                    max_cost_usd=0.2)
        seen["second"] = await call(client, "delegate", to="helper", objective="one more", max_cost_usd=0.1)
        seen["other_run"] = await call(client, "get_run", run_id=int(os.environ["OTHER_RUN"]))
        seen["own_run"] = await call(client, "get_run", run_id=int(os.environ["TETHER_RUN_ID"]))
        seen["start_run"] = await call(client, "start_run", instance="helper", objective="escape")
        seen["list_instances"] = await call(client, "list_instances")

async def later_act():
    try:
        http, client = session(pathlib.Path("token.txt").read_text())
        async with http, client:
            seen["old_token"] = await call(client, "delegate", to="helper", objective="again", max_cost_usd=0.1)
    except Exception as exc:
        seen["old_token"] = {"raised": describe(exc)}
    answer = httpx2.post(os.environ["TETHER_MCP_URL"], headers={
        "Authorization": "Bearer " + pathlib.Path("token.txt").read_text(),
        "Accept": "application/json, text/event-stream"}, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    seen["old_token_http"] = [answer.status_code, answer.json()]
    http, client = session()
    async with http, client:
        child = int(instruction.split("→ run ")[1].split(" ")[0])
        seen["child"] = await call(client, "get_run", run_id=child)
    pathlib.Path("REPORT.md").write_text("from my child:\\n" + instruction)

if "The runs you delegated have finished" in instruction:
    asyncio.run(later_act())
else:
    pathlib.Path("token.txt").write_text(os.environ["TETHER_TOKEN"])
    asyncio.run(first_act())
pathlib.Path("seen.json").write_text(json.dumps(seen))
print("act", os.environ["TETHER_ITERATION"], "done")
"""
)

HELPER = (
    "pathlib.Path('helped.txt').write_text('helped: ' + sys.stdin.read()[:40])\nprint('I helped with it')\n"
)
CHECK_REPORT = "sys.exit(0 if 'I helped with it' in pathlib.Path('REPORT.md').read_text() else 1)\n"


@pytest.fixture
def lead(user, other_user, make_instance, script, settings):
    settings.TETHER_DELEGATION_MAX_CHILDREN = 1
    make_instance(user, name="helper", command=script(HELPER))
    theirs = make_instance(other_user, name="theirs")
    other = services.run_start(instance=theirs, user=other_user, objective="not yours")
    return make_instance(
        user,
        name="lead",
        command=script(LEAD),
        tools=["delegate"],
        decider="checks",
        max_iterations=3,
        checks=[{"name": "report", "command": script(CHECK_REPORT)}],
        env={"OTHER_RUN": str(other.pk)},
    )


def seen(instance):
    return json.loads((instance.workspace_path() / "seen.json").read_text())


def test_a_command_agent_delegates_through_mcp_waits_and_resumes_with_the_result(user, lead):
    run = drive_in_thread(
        services.run_start(instance=lead, user=user, objective="write the report", max_cost_usd="1.00")
    )
    said = seen(lead)
    assert said["tools"] == ["delegate", "get_run"]
    # Parked on its child: no lease, no worker; the child's pool is carved under the parent's.
    assert run.status == "waiting" and run.lease_token is None and run.delegation["state"] == "waiting", (
        run.outcome_detail
    )
    (child,) = Run.objects.filter(parent=run)
    assert said["helper"]["ok"]["accepted"] is True and child.objective == "help with the report"
    assert (child.instance.name, child.depth, child.max_cost_micros) == ("helper", 1, 200_000)
    assert Pool.objects.get(kind="run", run=child).parent_id == Pool.objects.get(kind="run", run=run).pk
    assert Event.objects.filter(run=run, kind="run.delegated", data__children=[child.pk]).exists()

    assert drive_in_thread(child).outcome == "done"
    run.refresh_from_db()
    assert run.status == "queued" and f"run {child.pk} on helper: done" in run.next_instruction
    run = drive_in_thread(run)
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    report = (lead.workspace_path() / "REPORT.md").read_text()
    assert "I helped with it" in report and f"→ run {child.pk} on helper: done" in report
    said = seen(lead)
    assert said["child"]["ok"]["id"] == child.pk and said["child"]["ok"]["outcome"] == "done"
    assert run.spent_micros + child.spent_micros <= 1_000_000
    assert selectors.audit_pools() == []
    assert not Reservation.objects.filter(status="held").exists()


def test_refusals_are_tool_errors_and_the_token_reaches_nothing_else(user, lead):
    run = drive_in_thread(
        services.run_start(instance=lead, user=user, objective="write the report", max_cost_usd="1.00")
    )
    said = seen(lead)
    # A child too big for the headroom, a target that does not exist, one past the per-act bound:
    # each an error the program reads, and no run for any of them.
    assert "does not fit" in said["too_big"]["error"]
    assert "no instance or template named 'nobody'" in said["nobody"]["error"]
    assert "at most 1 children per act" in said["second"]["error"]
    assert Run.objects.filter(parent=run).count() == 1
    # Another user's run, and its own run (not a child), read as not found; no other tool exists.
    assert "not found" in said["other_run"]["error"] and "not found" in said["own_run"]["error"]
    assert "start_run" in json.dumps(said["start_run"]) and "ok" not in said["start_run"]
    assert "ok" not in said["list_instances"]
    assert Run.objects.filter(objective="escape").count() == 0

    (child,) = Run.objects.filter(parent=run)
    drive_in_thread(child)
    drive_in_thread(Run.objects.get(pk=run.pk))
    # The first act's token, used in a later act: its act ended, so it is refused outright.
    old = seen(lead)["old_token"]
    assert "ok" not in old and "error" not in old and old["raised"], old  # the SDK could not even connect
    status, body = seen(lead)["old_token_http"]
    assert status == 401 and "an act's token dies when its act ends" in body["error"]
    assert Run.objects.filter(objective="again").count() == 0


def test_the_depth_bound_refuses_as_a_tool_error(user, lead, settings):
    settings.TETHER_DELEGATION_MAX_DEPTH = 0
    run = drive_in_thread(
        services.run_start(instance=lead, user=user, objective="write the report", max_cost_usd="1.00")
    )
    assert "levels deep, past the limit of 0" in seen(lead)["helper"]["error"]
    assert not Run.objects.filter(parent=run).exists()
    assert run.status != "waiting"  # nothing was delegated: the act goes on to its checks


def test_an_instance_without_the_delegate_tool_gets_no_endpoint(user, make_instance, script):
    probe = make_instance(
        user,
        name="probe",
        command=script(
            "pathlib.Path('env.json').write_text(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('TETHER_', 'ANTHROPIC_'))}))\n"
        ),
    )
    drive_in_thread(services.run_start(instance=probe, user=user, objective="look"))
    env = json.loads((probe.workspace_path() / "env.json").read_text())
    assert "TETHER_TOKEN" not in env and "TETHER_MCP_URL" not in env and "ANTHROPIC_API_KEY" not in env


def test_a_gateway_token_of_an_instance_without_delegate_is_refused_at_mcp(
    user, make_instance, script, price
):
    from instances.models import Credential

    key = "sk-ant-api03-CMDDELEGTESTKEY-0123456789abcdefWXYZ"
    probe = make_instance(
        user,
        name="metered",
        credential=Credential.create_for(user, label="k", secret=key),
        model="claude-test-1",
        command=script(
            """
            import httpx2
            answer = httpx2.post(os.environ["ANTHROPIC_BASE_URL"] + "/mcp",
                                 headers={"Authorization": "Bearer " + os.environ["ANTHROPIC_API_KEY"],
                                          "Accept": "application/json, text/event-stream"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            pathlib.Path("answer.json").write_text(json.dumps([answer.status_code, answer.json()]))
            """
        ),
    )
    drive_in_thread(services.run_start(instance=probe, user=user, objective="probe"))
    status, body = json.loads((probe.workspace_path() / "answer.json").read_text())
    assert status == 403 and "does not enable the delegate tool" in body["error"]


# A middle agent: delegates to the helper, then (resumed) reports what it heard.
MIDDLE = (
    MCP
    + """
instruction = sys.stdin.read()
if "The runs you delegated have finished" in instruction:
    print("middle heard: " + instruction.split("\\n")[2])
    sys.exit(0)

async def main():
    http, client = session()
    async with http, client:
        result = await call(client, "delegate", to="helper", objective="the deepest part", max_cost_usd=0.1)
        assert "ok" in result, result

asyncio.run(main())
"""
)
LEAD_OF_TWO_LEVELS = (
    MCP
    + """
instruction = sys.stdin.read()
if "The runs you delegated have finished" in instruction:
    pathlib.Path("REPORT.md").write_text(instruction)
    sys.exit(0)

async def main():
    http, client = session()
    async with http, client:
        result = await call(client, "delegate", to="middle", objective="delegate further", max_cost_usd=0.5)
        assert "ok" in result, result

asyncio.run(main())
"""
)


def test_a_child_that_delegates_in_turn_is_reported_to_its_parent_under_its_own_call(
    user, make_instance, script
):
    make_instance(user, name="helper", command=script(HELPER))
    make_instance(user, name="middle", command=script(MIDDLE), tools=["delegate"], max_iterations=3)
    lead = make_instance(
        user, name="lead", command=script(LEAD_OF_TWO_LEVELS), tools=["delegate"], max_iterations=3
    )
    run = drive_in_thread(
        services.run_start(instance=lead, user=user, objective="go deep", max_cost_usd="1.00")
    )
    (middle,) = Run.objects.filter(parent=run)
    middle = drive_in_thread(middle)
    assert middle.status == "waiting"  # parked on its own child
    (deepest,) = Run.objects.filter(parent=middle)
    assert deepest.depth == 2 and drive_in_thread(deepest).outcome == "done"
    assert drive_in_thread(Run.objects.get(pk=middle.pk)).outcome == "done"
    assert drive_in_thread(Run.objects.get(pk=run.pk)).outcome == "done"
    report = (lead.workspace_path() / "REPORT.md").read_text()
    assert f"## delegate call mcp_1_1 → run {middle.pk} on middle: done" in report, report
    assert f"middle heard: ## delegate call mcp_1_1 → run {deepest.pk} on helper: done" in report, report
