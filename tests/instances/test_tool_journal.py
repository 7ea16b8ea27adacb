"""The journal of tool calls: a re-run of a Claude-brain act replays its calls instead of repeating them."""

import threading

import pytest
from django.db import OperationalError, connection

from instances.models import McpServer
from loops import journal, services
from loops.models import Event, Run, ToolCall
from tests.fakes.messages_server import text, tool_use, tool_uses
from tests.instances.test_mcp_tools import NOTES_SERVER
from tests.loops.test_db_faults import FaultOnce
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def conversing(server, *answers):
    """Let Claude answer from where the conversation is: the nth answer after n assistant turns."""
    server.responder = lambda body: answers[sum(m["role"] == "assistant" for m in body["messages"])]


def a_run(inst):
    return services.run_start(instance=inst, user=inst.owner, objective="write the files")


class StoppedAfterOneCall(journal.ToolJournal):
    """The journal of an attempt that ends (as a killed worker's would) right after its first call."""

    def __init__(self, run_id, stop):
        super().__init__(run_id, 1, 1)
        self.stop = stop

    def finished(self, key, result, is_error):
        super().finished(key, result, is_error)
        self.stop.set()


@pytest.mark.parametrize(
    "first, written",
    [
        (("write_file", {"path": "a.txt", "content": "one"}), "a.txt"),
        (("mcp__notes__record", {"note": "one"}), "noted.txt"),
    ],
    ids=["built-in", "mcp"],
)
def test_a_re_run_replays_the_journaled_calls_of_a_turn_and_runs_the_rest(
    agent, act, server, price, script, first, written
):
    servers = ["notes"] if first[0].startswith("mcp__") else []
    for name in servers:
        McpServer(name=name, transport="stdio", command=script(NOTES_SERVER), everyone=True).save()
    inst = agent(tools=["write_file"], mcp_servers=servers)
    run = a_run(inst)
    ws = inst.workspace_path()
    conversing(
        server,
        tool_uses([first, ("write_file", {"path": "b.txt", "content": "two"})], say="writing both"),
        text("both written"),
    )
    stop = threading.Event()
    cut = act(inst, stop=stop, run_id=run.pk, journal=StoppedAfterOneCall(run.pk, stop))
    assert cut.stopped and (ws / written).read_text() == "one" and not (ws / "b.txt").exists()
    (ws / written).write_text("changed since")

    reply = act(inst, run_id=run.pk, journal=journal.ToolJournal(run.pk, 1, 2))
    assert reply.ok, reply.detail
    assert (ws / written).read_text() == "changed since"  # the journaled call did not run again
    assert (ws / "b.txt").read_text() == "two"  # the call never started ran now
    assert server.calls == 2 and server.problems == []  # the turn was not asked for again
    assert [(c["name"], c["key"], c.get("replayed")) for c in reply.tool_calls] == [
        (first[0], f"r{run.pk}-i1-t1-c0", "result"),
        ("write_file", f"r{run.pk}-i1-t1-c1", None),
    ]
    assert reply.text == "writing both\n\nboth written"
    assert [(c["state"], c["attempt"]) for c in journal.calls_of(run.pk, 1)] == [("finished", 1), ("finished", 2)]


@pytest.mark.parametrize("marker", ['INSERT INTO "loops_toolcall"', 'UPDATE "loops_toolcall"'], ids=["start", "result"])
def test_a_cut_while_journaling_is_retried_and_the_call_runs_once(agent, act, server, price, marker):
    inst = agent()
    run = a_run(inst)
    conversing(server, tool_use("write_file", {"path": "a.txt", "content": "one"}), text("written"))
    fault = FaultOnce(marker)
    with connection.execute_wrapper(fault):
        reply = act(inst, run_id=run.pk, journal=journal.ToolJournal(run.pk, 1, 1))
    assert fault.fired == 1 and reply.ok, reply.detail
    assert journal.calls_of(run.pk, 1) == [
        {"name": "write_file", "key": f"r{run.pk}-i1-t1-c0", "state": "finished", "is_error": False, "attempt": 1}
    ]


def test_a_call_that_cannot_be_journaled_does_not_run(agent, act, server, price):
    inst = agent()
    run = a_run(inst)
    conversing(server, tool_use("write_file", {"path": "a.txt", "content": "one"}), text("written"))

    def broken(execute, sql, params, many, context):
        if 'INSERT INTO "loops_toolcall"' in sql:
            raise OperationalError("disk I/O error")  # not a fault a retry gets past
        return execute(sql, params, many, context)

    with connection.execute_wrapper(broken):
        reply = act(inst, run_id=run.pk, journal=journal.ToolJournal(run.pk, 1, 1))
    assert not reply.ok and reply.detail == f"the tool journal could not record r{run.pk}-i1-t1-c0 (OperationalError)"
    assert not (inst.workspace_path() / "a.txt").exists() and server.calls == 1


class Blind(journal.ToolJournal):
    """A journal that did not see what an earlier attempt journaled (as a stale driver might not)."""

    def replay(self):
        super().replay()
        return {}


def test_a_call_journaled_already_is_not_run_by_an_attempt_that_missed_it(agent, act, server, price):
    inst = agent()
    run = a_run(inst)
    conversing(server, tool_use("write_file", {"path": "a.txt", "content": "one"}), text("written"))
    assert act(inst, run_id=run.pk, journal=journal.ToolJournal(run.pk, 1, 1)).ok
    (inst.workspace_path() / "a.txt").write_text("changed since")

    reply = act(inst, run_id=run.pk, journal=Blind(run.pk, 1, 2))
    assert not reply.ok and "journaled by another attempt" in reply.detail
    assert (inst.workspace_path() / "a.txt").read_text() == "changed since"


def test_approved_calls_are_journaled_before_the_first_model_call(agent, act, server, price):
    inst = agent(approval_tools=["write_file"])
    run = a_run(inst)
    approved = [{"name": "write_file", "input": {"path": "deploy.txt", "content": "approved\n"}}]
    conversing(server, text("deployed"))
    assert act(inst, run_id=run.pk, approved_calls=approved, journal=journal.ToolJournal(run.pk, 1, 1)).ok
    (inst.workspace_path() / "deploy.txt").write_text("changed since")

    reply = act(inst, run_id=run.pk, approved_calls=approved, journal=journal.ToolJournal(run.pk, 1, 2))
    assert reply.ok and (inst.workspace_path() / "deploy.txt").read_text() == "changed since"
    assert reply.tool_calls[0]["key"] == f"r{run.pk}-i1-t0-c0" and reply.tool_calls[0]["replayed"] == "result"


def messages_requests(server):
    return [r for r in server.requests if r.path.startswith("/v1/messages") and "count_tokens" not in r.path]


def turn_of(request):
    """Which turn of the act a Messages request asked for: the assistant answers it carried."""
    return sum(m["role"] == "assistant" for m in request.body["messages"])


def summary(request):
    return {"turn": turn_of(request), "events_sent": request.events_sent, "disconnected": request.disconnected}


def tool_results(request):
    """The tool_result blocks a Messages request sent, by tool_use id (cache markers left out)."""
    return {
        b["tool_use_id"]: {k: v for k, v in b.items() if k != "cache_control"}
        for m in request.body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }


@pytest.mark.slow
def test_a_run_killed_between_two_tool_calls_reruns_without_repeating_the_journaled_one(
    agent, server, script, price, tmp_path
):
    check = script("sys.exit(0 if pathlib.Path('a.txt').read_text() == 'from the test' else 1)\n")
    inst = agent(decider="checks", checks=[{"name": "a", "command": check}], act_timeout_seconds=120)
    # Claude answers from where the conversation is: a re-run that started the act afresh would
    # be told to write a.txt again.
    conversing(
        server,
        tool_use("write_file", {"path": "a.txt", "content": "from the model"}, say="writing a.txt"),
        tool_use("run_command", {"command": "sleep 20"}),
        text("a.txt is written; the command was cut off"),
    )
    run = services.run_start(instance=inst, user=inst.owner, objective="write a.txt, then run the command")
    first = Cluster("first", tmp_path)
    try:
        wait_for(
            lambda: ToolCall.objects.filter(run=run, name="run_command").exists(), 60, "run_command to be journaled"
        )
        first.kill()  # mid-act: write_file ran and is journaled finished, run_command only started
    finally:
        first.stop()
    written = ToolCall.objects.get(run=run, name="write_file")
    assert written.finished_at is not None and not written.is_error
    assert ToolCall.objects.get(run=run, name="run_command").finished_at is None
    (inst.workspace_path() / "a.txt").write_text("from the test")  # what a second write_file would overwrite
    before = messages_requests(server)
    # Turns 1 and 2 were asked for (a transient fault may have asked one of them twice), turn 3 not yet.
    assert {turn_of(r) for r in before} == {0, 1}, ([summary(r) for r in before], first.tail())

    # Longer leases than the killed cluster's: a loaded machine never expires a lease the survivor keeps.
    second = Cluster("second", tmp_path, TETHER_LEASE_SECONDS="10")
    try:
        run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 60, "the re-run to finish")
    finally:
        second.stop()
    assert (run.outcome, run.verified) == ("done", True), (run.outcome, run.outcome_detail, second.tail())
    assert (inst.workspace_path() / "a.txt").read_text() == "from the test"  # write_file did not run again
    again = messages_requests(server)[len(before):]
    # The re-run asked only for turn 3: turns 1 and 2 came back from the journal.
    assert [turn_of(r) for r in again] == [2], ([summary(r) for r in again], second.tail())
    answers = [[r.reply for r in before if turn_of(r) == turn][-1] for turn in (0, 1)]  # a retry's answer is the one kept
    results = tool_results(again[0])
    write_id, command_id = (a["content"][-1]["id"] for a in answers)
    assert results[write_id] == {"type": "tool_result", "tool_use_id": write_id, "content": written.result}
    assert results[command_id]["is_error"] is True
    assert results[command_id]["content"].startswith("interrupted: a previous attempt of this act started this call")
    assert ToolCall.objects.filter(run=run).count() == 2  # nothing journaled twice
    finished = Event.objects.get(run=run, kind="act.finished")
    keys = [(c["name"], c.get("key"), c.get("replayed")) for c in finished.data["tool_calls"]]
    assert keys == [
        ("write_file", f"r{run.pk}-i1-t1-c0", "result"),
        ("run_command", f"r{run.pk}-i1-t2-c0", "interrupted"),
    ]
    assert "writing a.txt" in finished.data["response"]  # what the model said before the kill is kept
    assert journal.calls_of(run.pk, 1)[1]["state"] == "started"
