"""MCP servers an operator registered, used by a Claude-brain run through their tools.

The MCP server is a real stdio program built with the SDK's `MCPServer`, started by Tether in
the agent's sandbox; Claude is the local Messages server, scripted to call its tools.
"""

import json

import pytest
from django.conf import settings

from instances.models import McpServer
from loops import leases, runner, services
from loops.models import Event, Iteration
from tests.fakes.messages_server import text, tool_use
from tests.instances.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "notes-token-SECRET-5f0c2a9e7d41"
# The server's tools: look a term up, note something in the workspace (a side effect a person may
# want to approve), show the token it was given, read any file it is asked for.
NOTES_SERVER = """
from mcp.server.mcpserver import MCPServer

app = MCPServer("notes")

@app.tool()
def lookup(term: str) -> str:
    \"\"\"Look a term up in the team's notes.\"\"\"
    return f"notes on {term}: durable loops"

@app.tool()
def record(note: str) -> str:
    \"\"\"Write a note into the workspace.\"\"\"
    pathlib.Path("noted.txt").write_text(note)
    return "recorded"

@app.tool()
def token() -> str:
    \"\"\"Show the token this server was given.\"\"\"
    return "my token is " + os.environ.get("NOTES_TOKEN", "(none)")

@app.tool()
def peek(path: str) -> str:
    \"\"\"Read a file.\"\"\"
    try:
        return "read: " + pathlib.Path(path).read_text()
    except OSError as exc:
        return f"cannot read: {type(exc).__name__}"

@app.tool()
def connect(port: int) -> str:
    \"\"\"Open a TCP connection to this machine's loopback.\"\"\"
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return "connected"
    except OSError as exc:
        return f"cannot connect: {type(exc).__name__}"

app.run()
"""


@pytest.fixture
def notes(script):
    """The `notes` MCP server, registered as an operator would, granted to nobody in particular."""

    def register(**fields):
        server = McpServer(name="notes", transport="stdio", command=script(NOTES_SERVER), **fields)
        server.set_secrets(env={"NOTES_TOKEN": TOKEN})
        server.save()
        return server

    return register


@pytest.fixture
def mcp_agent(agent, price):
    def build(**fields):
        fields.setdefault("tools", ["read_file", "write_file"])
        fields.setdefault("mcp_servers", ["notes"])
        fields.setdefault("decider", "llm")
        fields.setdefault("max_iterations", 2)
        return agent(**fields)

    return build


def drive(instance, objective="find out what the notes say about tether"):
    run = services.run_start(instance=instance, user=instance.owner, objective=objective)
    return resume(run)


def resume(run):
    lease = leases.claim(run.pk, run.next_iteration, "test-driver")
    assert lease is not None
    runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    return run


def tool_calls(run):
    return [
        c
        for e in Event.objects.filter(run=run, kind="act.finished").order_by("seq")
        for c in e.data["tool_calls"]
    ]


def tool_results(server, request_index):
    """Return the tool_result blocks of the last user turn of one request to the Messages server."""
    return [
        b for b in server.bodies[request_index]["messages"][-1]["content"] if b.get("type") == "tool_result"
    ]


def everything_recorded(run):
    rows = [json.dumps(e.data) for e in Event.objects.filter(run=run)]
    rows += [
        f"{i.response} {i.act_detail} {i.decision} {i.instruction}" for i in Iteration.objects.filter(run=run)
    ]
    rows += [run.outcome_detail, json.dumps(run.history), run.next_instruction]
    return "\n".join(rows)


def test_a_registered_stdio_server_s_tool_is_called_by_a_claude_run_and_recorded(notes, mcp_agent, server):
    notes(everyone=True)
    server.enqueue(
        tool_use("mcp__notes__lookup", {"term": "tether"}, say="Checking the notes."),
        text("The notes say: durable loops."),
        tool_use("record_decision", {"verdict": "done", "reason": "the notes were read"}),
    )
    run = drive(mcp_agent())

    assert (run.outcome, run.status) == ("done", "finished"), run.outcome_detail
    offered = [t["name"] for t in server.bodies[0]["tools"]]
    assert offered[:2] == ["read_file", "write_file"]  # beside the built-in ones
    assert {"mcp__notes__lookup", "mcp__notes__record", "mcp__notes__token", "mcp__notes__peek"} <= set(
        offered
    )
    described = next(t for t in server.bodies[0]["tools"] if t["name"] == "mcp__notes__lookup")
    assert "Look a term up" in described["description"] and described["input_schema"]["required"] == ["term"]
    [result] = tool_results(server, 1)
    assert result["content"] == "notes on tether: durable loops" and not result.get("is_error")
    [call] = tool_calls(run)
    assert call["name"] == "mcp__notes__lookup" and call["input"] == {"term": "tether"}
    assert call["is_error"] is False and call["result"] == "notes on tether: durable loops"


def test_the_server_s_secret_is_redacted_from_what_the_model_and_the_records_see(notes, mcp_agent, server):
    notes(everyone=True)
    server.enqueue(
        tool_use("mcp__notes__token", {}),
        text("Done."),
        tool_use("record_decision", {"verdict": "done", "reason": "shown"}),
    )
    run = drive(mcp_agent())
    [result] = tool_results(server, 1)
    assert result["content"].startswith("my token is ") and TOKEN not in result["content"]
    assert TOKEN not in everything_recorded(run) and KEY not in everything_recorded(run)
    assert TOKEN not in McpServer.objects.get(name="notes").secrets_encrypted  # stored encrypted


def test_the_stdio_server_runs_in_the_sandbox_and_cannot_read_tether_home(notes, mcp_agent, server, tmp_path):
    from pathlib import Path

    home = Path(settings.TETHER_HOME)
    home.mkdir(parents=True, exist_ok=True)
    probe = home / "mcp-sandbox-probe"
    probe.write_text("PLATFORM-ONLY")
    try:
        notes(everyone=True)
        server.enqueue(
            tool_uses_of(
                ("mcp__notes__peek", {"path": str(probe)}), ("mcp__notes__peek", {"path": "/proc/1/cmdline"})
            ),
            text("I could not read it."),
            tool_use("record_decision", {"verdict": "done", "reason": "checked"}),
        )
        run = drive(mcp_agent())
    finally:
        probe.unlink()
    assert run.outcome == "done", run.outcome_detail
    home_result, init_result = tool_results(server, 1)
    assert home_result["content"].startswith("cannot read") and "PLATFORM-ONLY" not in home_result["content"]
    # Its own PID namespace: process 1 is the sandbox's, not this machine's init.
    assert "bwrap" in init_result["content"] or "cannot read" in init_result["content"]
    # A server's NULs never reach the records (PostgreSQL refuses them).
    assert "\x00" not in init_result["content"]


def test_the_stdio_server_cannot_reach_this_machine_s_loopback(notes, mcp_agent, server):
    from urllib.parse import urlsplit

    notes(everyone=True)
    port = urlsplit(server.url).port  # the Messages server, listening on the host's 127.0.0.1
    server.enqueue(
        tool_use("mcp__notes__connect", {"port": port}),
        text("No way through."),
        tool_use("record_decision", {"verdict": "done", "reason": "checked"}),
    )
    run = drive(mcp_agent())
    assert run.outcome == "done", run.outcome_detail
    [result] = tool_results(server, 1)
    assert result["content"].startswith("cannot connect"), result["content"]


def tool_uses_of(*calls):
    from tests.fakes.messages_server import tool_uses

    return tool_uses([(name, args, None) for name, args in calls])


@pytest.mark.parametrize("gate", ["instance", "operator"])
def test_a_gated_mcp_tool_waits_for_approval_and_runs_once_approved(notes, mcp_agent, server, user, gate):
    notes(everyone=True, approval_tools=["record"] if gate == "operator" else [])
    inst = mcp_agent(approval_tools=["mcp__notes__record"] if gate == "instance" else [])
    noted = inst.workspace_path() / "noted.txt"
    server.enqueue(tool_use("mcp__notes__record", {"note": "ship it"}, say="I will record the decision."))
    run = drive(inst)

    assert run.status == "waiting", (run.status, run.outcome_detail)
    assert "needs approval: mcp__notes__record" in run.outcome_detail
    assert not noted.exists()  # nothing ran before a person said yes
    services.run_interject(run=run, user=user, text="go ahead", approve=True)
    server.enqueue(text("Recorded."), tool_use("record_decision", {"verdict": "done", "reason": "recorded"}))
    run = resume(run)

    assert run.outcome == "done", run.outcome_detail
    assert noted.read_text() == "ship it"
    assert "A person approved" in json.dumps(server.bodies[1]["messages"][0]["content"])
    proposed, ran = tool_calls(run)  # the first act's proposal, then the approved call the second act ran
    assert proposed["name"] == ran["name"] == "mcp__notes__record" and proposed["needs_approval"] is True
    assert ran["is_error"] is False and ran["result"] == "recorded"


def test_a_refused_mcp_call_never_runs(notes, mcp_agent, server, user):
    notes(everyone=True, approval_tools=["record"])
    inst = mcp_agent()
    server.enqueue(tool_use("mcp__notes__record", {"note": "ship it"}))
    run = drive(inst)
    assert run.status == "waiting"
    services.run_interject(run=run, user=user, text="not today", approve=False)
    server.enqueue(
        text("Understood."), tool_use("record_decision", {"verdict": "failed", "reason": "refused"})
    )
    run = resume(run)
    assert run.outcome == "failed"
    assert not (inst.workspace_path() / "noted.txt").exists()
    assert "refused: mcp__notes__record" in Iteration.objects.get(run=run, number=2).instruction


def test_a_deny_listed_mcp_tool_is_not_offered_and_a_call_to_it_is_refused(notes, mcp_agent, server):
    notes(everyone=True, tool_deny=["rec*"])
    inst = mcp_agent()
    server.enqueue(
        tool_use("mcp__notes__record", {"note": "sneaky"}),
        text("It was refused."),
        tool_use("record_decision", {"verdict": "done", "reason": "nothing to do"}),
    )
    run = drive(inst)
    offered = {t["name"] for t in server.bodies[0]["tools"]}
    assert "mcp__notes__record" not in offered and "mcp__notes__lookup" in offered
    [result] = tool_results(server, 1)
    assert result.get("is_error") and "not allowed" in result["content"]
    assert not (inst.workspace_path() / "noted.txt").exists()
    assert tool_calls(run)[0]["is_error"] is True


def test_the_instance_s_tools_list_narrows_a_server_to_the_tools_it_names(notes, mcp_agent, server):
    notes(everyone=True)
    inst = mcp_agent(tools=["read_file", "mcp__notes__look*"])
    server.enqueue(
        tool_use("mcp__notes__peek", {"path": "x"}),
        text("Refused."),
        tool_use("record_decision", {"verdict": "done", "reason": "ok"}),
    )
    drive(inst)
    offered = [t["name"] for t in server.bodies[0]["tools"]]
    assert offered == ["read_file", "mcp__notes__lookup"]
    [result] = tool_results(server, 1)
    assert result.get("is_error") and "not allowed" in result["content"]


def test_a_server_that_cannot_start_is_a_tool_error_the_model_reads_not_a_crash(script, mcp_agent, server):
    broken = McpServer.objects.create(
        name="notes",
        command=script("sys.stderr.write('cannot open the notes database\\n'); sys.exit(3)\n"),
        everyone=True,
    )
    server.enqueue(
        tool_use("mcp__notes__lookup", {"term": "tether"}),
        text("The notes server is down; I will carry on without it."),
        tool_use("record_decision", {"verdict": "done", "reason": "nothing else to do"}),
    )
    run = drive(mcp_agent())

    assert (run.status, run.outcome) == ("finished", "done"), run.outcome_detail
    opening = json.dumps(server.bodies[0]["messages"][0]["content"])
    assert (
        "MCP server 'notes' could not be reached" in opening and "cannot open the notes database" in opening
    )
    [result] = tool_results(server, 1)
    assert result.get("is_error") and "unavailable" in result["content"]
    names = [c["name"] for c in tool_calls(run)]
    assert names == ["mcp__notes", "mcp__notes__lookup"]  # the failed connection is on the record too
    assert broken.pk


def test_a_server_turned_off_or_no_longer_granted_is_not_connected(notes, mcp_agent, server, user):
    registered = notes()
    registered.users.add(user)
    inst = mcp_agent()
    registered.users.remove(user)
    server.enqueue(
        text("No notes for me."),
        tool_use("record_decision", {"verdict": "done", "reason": "ok"}),
    )
    drive(inst)
    assert not any(t["name"].startswith("mcp__") for t in server.bodies[0]["tools"])
    assert "no longer granted" in json.dumps(server.bodies[0]["messages"][0]["content"])


def test_an_agent_cannot_call_a_server_its_instance_did_not_enable(notes, mcp_agent, server, tmp_path):
    notes(everyone=True)
    inst = mcp_agent(mcp_servers=[])
    server.enqueue(
        tool_use("mcp__notes__record", {"note": "from an agent that was not given notes"}),
        text("Not mine to use."),
        tool_use("record_decision", {"verdict": "done", "reason": "ok"}),
    )
    run = drive(inst)
    assert not any(t["name"].startswith("mcp__") for t in server.bodies[0]["tools"])
    [result] = tool_results(server, 1)
    assert result.get("is_error") and "no MCP server 'notes'" in result["content"]
    assert not (inst.workspace_path() / "noted.txt").exists() and run.outcome == "done"


HTTP_SERVER = """
import uvicorn
from mcp.server.mcpserver import MCPServer

app = MCPServer("search")

@app.tool()
def search(query: str) -> str:
    \"\"\"Search the team's documents.\"\"\"
    return f"3 documents mention {query}"

inner = app.streamable_http_app()

async def guarded(scope, receive, send):
    # Only a client that sends the operator's header gets in.
    if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != b"Bearer %s":
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})
        return
    await inner(scope, receive, send)

uvicorn.run(guarded, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@pytest.fixture
def http_search(script):
    """A streamable-HTTP MCP server on this machine's loopback that wants a Bearer header."""
    import socket
    import subprocess
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = script(HTTP_SERVER.replace("%s", TOKEN))
    process = subprocess.Popen([*argv, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None, process.stderr.read().decode()
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=30)


def test_a_streamable_http_server_is_reached_with_its_secret_header(http_search, mcp_agent, server):
    registered = McpServer(
        name="search", transport="http", url=http_search, allow_private_url=True, everyone=True
    )
    registered.set_secrets(headers={"Authorization": f"Bearer {TOKEN}"})
    registered.save()
    server.enqueue(
        tool_use("mcp__search__search", {"query": "durable loops"}),
        text("Three documents."),
        tool_use("record_decision", {"verdict": "done", "reason": "searched"}),
    )
    run = drive(mcp_agent(mcp_servers=["search"]))
    assert run.outcome == "done", run.outcome_detail
    [result] = tool_results(server, 1)
    assert result["content"] == "3 documents mention durable loops" and not result.get("is_error")
    assert TOKEN not in everything_recorded(run)


def test_an_http_server_on_loopback_is_refused_at_connect_unless_the_operator_allowed_it(
    http_search, mcp_agent, server
):
    McpServer.objects.create(name="search", transport="http", url=http_search, everyone=True)
    server.enqueue(
        text("No search today."),
        tool_use("record_decision", {"verdict": "done", "reason": "ok"}),
    )
    run = drive(mcp_agent(mcp_servers=["search"]))
    assert run.outcome == "done", run.outcome_detail
    opening = json.dumps(server.bodies[0]["messages"][0]["content"])
    assert "loopback, link-local or private" in opening
    assert not any(t["name"].startswith("mcp__search") for t in server.bodies[0]["tools"])


def test_a_denied_tool_is_refused_at_once_even_when_the_instance_gates_it(notes, mcp_agent, server):
    notes(everyone=True, tool_deny=["record"])
    inst = mcp_agent(approval_tools=["mcp__notes__record"])
    server.enqueue(
        tool_use("mcp__notes__record", {"note": "x"}),
        text("Refused, so I stop."),
        tool_use("record_decision", {"verdict": "done", "reason": "ok"}),
    )
    run = drive(inst)
    assert run.status == "finished", run.outcome_detail  # not parked for a call that could never run
    [result] = tool_results(server, 1)
    assert result.get("is_error") and "not allowed" in result["content"]


def test_a_server_registered_through_the_admin_is_used_by_a_run_behind_an_approval_gate(
    admin_client, script, mcp_agent, server, user
):
    form = {
        "name": "notes",
        "transport": "stdio",
        "command": json.dumps(script(NOTES_SERVER)),
        "url": "",
        "tool_allow": "[]",
        "tool_deny": "[]",
        "approval_tools": '["record"]',
        "timeout_seconds": 60,
        "enabled": "on",
        "everyone": "on",
        "secret_env": f"NOTES_TOKEN={TOKEN}",
    }
    assert admin_client.post("/admin/instances/mcpserver/add/", form).status_code == 302
    inst = mcp_agent()
    server.enqueue(tool_use("mcp__notes__record", {"note": "from the admin's server"}))
    run = drive(inst)
    assert run.status == "waiting" and "needs approval: mcp__notes__record" in run.outcome_detail
    services.run_interject(run=run, user=user, text="yes", approve=True)
    server.enqueue(
        tool_use("mcp__notes__token", {}),
        text("Recorded."),
        tool_use("record_decision", {"verdict": "done", "reason": "recorded"}),
    )
    run = resume(run)
    assert run.outcome == "done", run.outcome_detail
    assert (inst.workspace_path() / "noted.txt").read_text() == "from the admin's server"
    [shown] = tool_results(server, 2)
    assert shown["content"].startswith("my token is ") and TOKEN not in everything_recorded(run)


def test_a_server_that_never_answers_or_hangs_in_a_call_is_bounded_by_its_timeout(script, mcp_agent, server):
    mute = script("time.sleep(600)\n")
    McpServer.objects.create(name="mute", command=mute, everyone=True, timeout_seconds=2)
    slow = script(NOTES_SERVER.replace('return f"notes on {term}: durable loops"', "time.sleep(600)"))
    McpServer.objects.create(name="slow", command=slow, everyone=True, timeout_seconds=120)
    server.enqueue(
        tool_use("mcp__slow__lookup", {"term": "tether"}),
        text("Both are stuck; moving on."),
        tool_use("record_decision", {"verdict": "done", "reason": "nothing else"}),
    )
    run = drive(
        mcp_agent(mcp_servers=["mute", "slow"], tool_timeout_seconds=2)
    )  # a call gets the tool timeout
    assert (run.status, run.outcome) == ("finished", "done"), run.outcome_detail
    opening = json.dumps(server.bodies[0]["messages"][0]["content"])
    assert "MCP server 'mute' could not be reached (it did not answer within 2s)" in opening
    [result] = tool_results(server, 1)
    assert result.get("is_error") and "timed out" in result["content"].lower()
    assert not running(mute[-1]) and not running(slow[-1])  # no server outlives the act


def running(path):
    """Return whether a process whose command line names `path` is alive."""
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and path.encode() in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False
