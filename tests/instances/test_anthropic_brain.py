"""The anthropic brain against the local Messages API server, through the real SDK."""

import socket
import threading
import time

import pytest

from loops.compaction import compact_history
from tests.fakes.messages_server import Delay, Trickle, text, tool_use, tool_uses
from tests.instances.conftest import KEY
from tests.support.cluster import wait_for

pytestmark = pytest.mark.django_db


def usage(i, o, w=0, r=0):
    return {"input_tokens": i, "output_tokens": o, "cache_creation_input_tokens": w, "cache_read_input_tokens": r}


def test_multi_turn_tool_use_writes_files_and_sums_usage_exactly(agent, act, server):
    inst = agent()
    server.enqueue(
        tool_use("list_files", {"path": "."}, say="Looking around.", usage=usage(1200, 40, 900, 0)),
        tool_uses(
            [("write_file", {"path": "src/answer.txt", "content": "42\n"}),
             ("write_file", {"path": "notes.md", "content": "# notes\n"})],
            usage=usage(300, 85, 120, 900),
        ),
        tool_use("edit_file", {"path": "src/answer.txt", "old_text": "42", "new_text": "forty-two"},
                 usage=usage(50, 30, 60, 1020)),
        tool_use("run_command", {"command": "cat src/answer.txt"}, usage=usage(40, 20, 55, 1080)),
        text("Wrote src/answer.txt and notes.md; the answer reads forty-two.", usage=usage(35, 25, 70, 1135)),
    )
    reply = act(inst)

    assert reply.ok and not reply.stopped, reply.detail
    assert reply.text == "Looking around.\n\nWrote src/answer.txt and notes.md; the answer reads forty-two."
    ws = inst.workspace_path()
    assert (ws / "src/answer.txt").read_text() == "forty-two\n"
    assert (ws / "notes.md").read_text() == "# notes\n"
    u = reply.usage
    assert (u.input_tokens, u.output_tokens) == (1200 + 300 + 50 + 40 + 35, 40 + 85 + 30 + 20 + 25)
    assert (u.cache_write_tokens, u.cache_read_tokens) == (900 + 120 + 60 + 55 + 70, 900 + 1020 + 1080 + 1135)
    assert u.calls == server.calls == 5
    assert u.model == "claude-test-1"
    assert server.problems == []  # history sent back exactly as received, every tool_use answered
    # The shell tool's result went back to the model as a tool_result.
    last = server.bodies[-1]["messages"][-1]["content"][0]
    assert last["type"] == "tool_result" and "forty-two" in last["content"]
    assert [c["name"] for c in reply.tool_calls] == ["list_files", "write_file", "write_file", "edit_file", "run_command"]


def test_request_shape_stable_prefix_cached_and_tools_from_the_instance(agent, act, server):
    inst = agent(tools=["read_file", "write_file"], system_prompt="You are the test agent.", max_output_tokens=3000)
    server.enqueue(text("nothing to do"))
    act(inst, "look at the repo", snapshot=[{"iteration": 1, "instruction": "start", "response": "ok"}])
    body = server.bodies[0]
    assert body["model"] == "claude-test-1"
    assert body["max_tokens"] == 3000
    assert [t["name"] for t in body["tools"]] == ["read_file", "write_file"]
    assert body["tool_choice"] == {"type": "auto"}
    assert body["system"][0] == {"type": "text", "text": "You are the test agent.", "cache_control": {"type": "ephemeral"}}
    assert "make the answer file" in body["system"][1]["text"] and body["system"][1]["cache_control"]
    opening = body["messages"][0]["content"]
    assert "History of this run" in opening[0]["text"]
    assert opening[-1]["text"].endswith("look at the repo") and opening[-1]["cache_control"]


def test_the_stable_prefix_is_read_from_cache_on_the_next_act(agent, act, server):
    inst = agent()
    server.enqueue(text("first"), text("second"))
    first = act(inst, "one", iteration=1)
    second = act(inst, "two", iteration=2, snapshot=[{"iteration": 1, "instruction": "one", "response": "first"}])
    assert first.usage.cache_read_tokens == 0 and first.usage.cache_write_tokens > 0
    assert second.usage.cache_read_tokens > 0  # tools + system prompt + objective


def test_tool_errors_go_back_to_the_model_as_error_results(agent, act, server):
    inst = agent()
    server.enqueue(tool_use("read_file", {"path": "../../etc/passwd"}), text("could not read it"))
    reply = act(inst)
    result = server.bodies[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True and "'..' is not allowed" in result["content"]
    assert reply.ok and reply.tool_calls[0]["is_error"] is True


def test_disabled_tools_are_not_offered_and_not_run(agent, act, server):
    inst = agent(tools=["read_file"])
    server.enqueue(tool_use("run_command", {"command": "touch pwned"}), text("ok"))
    act(inst)
    assert [t["name"] for t in server.bodies[0]["tools"]] == ["read_file"]
    assert "unknown tool" in server.bodies[1]["messages"][-1]["content"][0]["content"]
    assert not (inst.workspace_path() / "pwned").exists()


def test_tool_turns_are_bounded(agent, act, server):
    inst = agent(max_tool_turns=2)
    server.responder = lambda body: tool_use("list_files", {})
    reply = act(inst)
    assert reply.ok and "limit of 2 tool turns" in reply.detail
    assert server.calls == 3  # two tool turns, then the model's third request is not run


def test_output_tokens_are_bounded_per_act(agent, act, server):
    inst = agent(max_output_tokens=100)
    server.responder = lambda body: tool_use("list_files", {}, usage=usage(10, 60))
    reply = act(inst)
    assert "100 output tokens" in reply.detail
    assert server.calls == 2 and reply.usage.output_tokens == 120
    assert [b["max_tokens"] for b in server.bodies] == [100, 40]


def test_a_tool_needing_approval_parks_the_act_with_the_proposed_call(agent, act, server):
    inst = agent(approval_tools=["run_command"])
    server.enqueue(tool_use("run_command", {"command": "make deploy"}, say="I will deploy."))
    reply = act(inst)
    assert not reply.ok and reply.detail.startswith("needs approval: run_command")
    assert reply.tool_calls == [
        {"name": "run_command", "input": {"command": "make deploy"}, "id": reply.tool_calls[0]["id"], "needs_approval": True}
    ]
    assert server.calls == 1 and reply.usage.calls == 1


def test_an_approved_call_runs_when_the_run_resumes(agent, act, server):
    inst = agent(approval_tools=["write_file"])
    call = {"path": "deploy.txt", "content": "approved\n"}
    server.enqueue(tool_use("write_file", call), text("deployed"))
    reply = act(inst, "continue", approved_calls=[{"name": "write_file", "input": call}])
    assert reply.ok, reply.detail
    assert (inst.workspace_path() / "deploy.txt").read_text() == "approved\n"
    opening = server.bodies[0]["messages"][0]["content"]
    assert any("A person approved" in block["text"] for block in opening)


def stop_once_asked(server, stop: threading.Event) -> None:
    """Set `stop` once the model has been asked (however long the act took to get there)."""

    def watch() -> None:
        wait_for(lambda: server.calls >= 1, 10, "the model to be asked")
        time.sleep(0.1)
        stop.set()

    threading.Thread(target=watch, daemon=True).start()


def test_stop_mid_call_returns_long_before_the_call_would_end(agent, act, server):
    inst = agent()
    server.enqueue(Delay(30, text("too late")))
    stop = threading.Event()
    stop_once_asked(server, stop)
    began = time.monotonic()
    reply = act(inst, stop=stop)
    elapsed = time.monotonic() - began
    assert elapsed < 15, elapsed  # the call would have taken 30 s
    assert reply.stopped and not reply.ok
    assert "abandoned" in reply.detail
    assert reply.usage.calls == 1 and reply.usage.input_tokens > 0  # the abandoned call counted as an estimate


def test_a_stop_before_the_answer_begins_hangs_up_the_connection(agent, act, server):
    # Nothing has come back yet, so there is no stream to close: the stop ends the connection itself.
    server.enqueue(Delay(30, text("too late")))
    stop = threading.Event()
    stop_once_asked(server, stop)
    reply = act(agent(), stop=stop)
    assert reply.stopped
    assert server.disconnected.wait(5.0), "the connection stayed open after the stop"


def test_a_stop_mid_stream_hangs_up_even_when_the_connection_s_descriptor_is_taken_at_once(agent, act, server):
    """After a stop the runner opens a database connection (on PostgreSQL): it takes the lowest free
    descriptor, often the one the model call's socket has just given back, while the call's reader
    is still waiting on that number. The stop must end the model call's connection all the same."""
    server.enqueue(Trickle(text("One slow word at a time. " * 20), every=1.0, size=8))
    stop = threading.Event()

    def stop_once_streaming() -> None:
        wait_for(lambda: server.requests and server.requests[0].events_sent, 10, "the answer to begin")
        time.sleep(0.2)  # the client has read it; the next event is a second away
        stop.set()

    threading.Thread(target=stop_once_streaming, daemon=True).start()
    with socket.create_server(("127.0.0.1", 0), backlog=64) as idle:
        reply = act(agent(), stop=stop)
        taken = [socket.create_connection(idle.getsockname()) for _ in range(32)]  # a database, say
        try:
            assert reply.stopped
            assert server.disconnected.wait(5.0), "the model call's connection stayed open after the stop"
        finally:
            for sock in taken:
                sock.close()


def test_stop_during_a_tool_returns_promptly(agent, act, server):
    inst = agent()
    server.enqueue(tool_use("run_command", {"command": "sleep 900"}), text("never asked"))
    stop = threading.Event()
    stop_once_asked(server, stop)
    began = time.monotonic()
    reply = act(inst, stop=stop)
    assert time.monotonic() - began < 300  # the tool would have taken 900 s (the bound leaves room for a loaded machine)
    assert reply.stopped and server.calls == 1


def test_a_stop_set_before_the_act_makes_no_call(agent, act, server):
    stop = threading.Event()
    stop.set()
    reply = act(agent(), stop=stop)
    assert reply.stopped and server.calls == 0


def test_the_act_time_limit_is_kept(agent, act, server):
    inst = agent()
    server.enqueue(Delay(30, text("too late")))
    began = time.monotonic()
    reply = act(inst, timeout=1.0)
    assert time.monotonic() - began < 15  # the call would have taken 30 s
    assert reply.timed_out and not reply.ok


def test_the_key_is_sent_as_a_header_and_appears_nowhere_else(agent, act, server, caplog, monkeypatch):
    import logging

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)  # even with the key in the platform's environment
    inst = agent()
    # A workspace that happens to hold the key (a committed .env, say): tools must not hand it on.
    (inst.workspace_path() / ".env").write_text(f"ANTHROPIC_API_KEY={KEY}\n")
    server.enqueue(
        tool_use("run_command", {"command": "env; echo $ANTHROPIC_API_KEY"}),
        tool_use("read_file", {"path": ".env"}),
        tool_use("run_command", {"command": "cat .env"}),
        tool_use("search_files", {"pattern": "sk-ant"}),
        # Even a model that somehow produced the key would not get it into the Reply.
        text(f"I found a key: {KEY}"),
    )
    reply = act(inst)
    assert reply.ok, reply.detail
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    shell_output = server.bodies[1]["messages"][-1]["content"][0]["content"]
    assert "PATH=" in shell_output and "ANTHROPIC" not in shell_output
    for body in server.bodies[2:]:
        assert "[redacted]" in body["messages"][-1]["content"][0]["content"]
    assert KEY not in repr(reply) and "[redacted]" in reply.text
    for received in server.requests:
        assert KEY.encode() not in received.raw
    assert KEY not in caplog.text
    assert any("anthropic" in r.name or "httpx" in r.name for r in caplog.records)  # the SDK did log


def test_input_tokens_per_act_stay_flat_as_the_snapshot_grows(agent, act, server, settings):
    settings.TETHER_CONTEXT_BUDGET_TOKENS = 1500
    inst = agent()
    server.responder = lambda body: text("did another step of the work " * 20)

    def history(n):
        return [
            {
                "iteration": i,
                "instruction": f"step {i}: fix the failing test number {i} in module_{i}.py " * 3,
                "response": f"I changed module_{i}.py and ran the tests; test {i} now passes. " * 8,
                "checks": {"tests": i % 3 != 0, "lint": True},
                "verdict": "continue",
            }
            for i in range(1, n + 1)
        ]

    def prompt_tokens(n):
        u = act(inst, f"iteration {n + 1}", snapshot=history(n), iteration=n + 1).usage
        return u.input_tokens + u.cache_read_tokens + u.cache_write_tokens

    sizes = {n: prompt_tokens(n) for n in (1, 10, 50, 200)}
    assert sizes[1] < sizes[10] < sizes[50], sizes
    assert abs(sizes[200] - sizes[50]) <= sizes[50] * 0.05, sizes
    assert sizes[200] < 1500 + 1000, sizes  # the history budget plus the fixed prompt
    naive_200 = sum(len(str(item)) for item in history(200)) // 4
    assert naive_200 > 5 * sizes[200]


RESULTS = (
    "The runs you delegated have finished. Their results (one per delegate call):\n\n"
    "## delegate call toolu_01Qm{n}Zx → run {run} on helper: done (unverified), spent $0.00\n"
    "detail: the act succeeded and no required checks are configured (unverified: no checks configured)\n"
    "final answer (excerpt):\nI helped with it\n\n\nGo on with the objective of this run:\nmake the answer file"
)
REFUSED = "delegate refused: this tree of runs already has 20, the limit"
RUNAWAYS = {
    # Re-delegates the same objective and hears the same back each round (its workspace changes, so the
    # no-progress rules let it run): told the round's results, it delegates again.
    "re-delegates": lambda n: dict(
        instruction=RESULTS.format(n=n, run=300 + n) if n > 1 else "make the answer file", response="",
        checks={}, verdict="continue", delegation="9f8e7d6c5b4a3f2e to 'helper': 'help with the answer file'",
    ),
    # Meets the same refusal and gets the same failing check every iteration.
    "is refused": lambda n: dict(
        instruction="The check answer failed: answer.txt is missing." if n > 1 else "make the answer file",
        response="The tree is full, so I will wait for the runs I started.", checks={"answer": False},
        verdict="continue", refused=[REFUSED],
    ),
}


@pytest.mark.parametrize("runaway", RUNAWAYS)
def test_a_runaway_leads_request_at_iteration_100_is_at_most_a_fifth_bigger_than_at_iteration_2(
    agent, act, server, runaway
):
    """The loop's memory of 99 iterations alike, sent by the SDK: the same size as after the first."""
    from loops.memory import Memory

    inst = agent(tools=["list_files", "read_file", "delegate"])
    server.responder = lambda body: text("Then I will wait.")
    memory, sent = Memory(), {}
    for number in range(1, 101):
        iteration = RUNAWAYS[runaway](number)
        if number in (2, 100):
            act(inst, iteration["instruction"], snapshot=[dict(s) for s in memory.snapshot], iteration=number)
            sent[number] = len(server.requests[-1].raw)
        memory = Memory.of(memory.after(fingerprint=f"f{number}", signature="s", act_ok=True, number=number, **iteration).as_json())
    assert sent[100] <= 1.2 * sent[2], sent
    history = server.bodies[-1]["messages"][0]["content"][0]["text"]
    assert "Iteration 99 (and 97 earlier alike, since iteration 2):" in history, history
    assert ("delegated to 'helper'" if runaway == "re-delegates" else f"refused: {REFUSED}") in history


def test_compaction_says_once_what_went_alike_and_what_was_delegated_and_refused():
    repeated = {
        "iteration": 99, "first": 3, "times": 97, "instruction": "the round's results " + "r" * 600,
        "response": "I will wait " + "w" * 600, "checks": {"t": False}, "verdict": "continue",
        "delegated": "to 'helper': 'help'", "refused": [REFUSED],
    }
    older = {**repeated, "iteration": 2, "first": 1, "times": 2, "instruction": "the objective", "refused": []}
    items = [older, *({"iteration": i, "instruction": f"step {i}"} for i in range(100, 102)), repeated]
    out = compact_history(items, budget_tokens=2000, recent=3)
    assert out.startswith("History of this run (101 earlier iterations; recent ones in full):")
    assert (
        "\n- #2 (and 1 earlier alike, since #1) continue; checks 0/1 (failing: t); delegated to 'helper': 'help'; "
        "did: the objective\n"
    ) in out
    assert "Iteration 99 (and 96 earlier alike, since iteration 3):\n" in out
    assert f"  delegated to 'helper': 'help'\n  refused: {REFUSED}\n" in out
    # A repeat is said briefly: each of its fields in at most 200 characters.
    assert max(len(line) for line in out.splitlines()) <= 200 + len("  agent answered: ")
    assert "verdict: continue" not in out  # an earlier iteration went on, as a rule
    assert compact_history([{"iteration": 1, "instruction": "go", "verdict": "done"}], budget_tokens=500) == (
        "History of this run:\nIteration 1:\n  instruction: go\n  verdict: done"
    )


def test_compaction_keeps_recent_iterations_verbatim_and_summarises_older_ones():
    items = [
        {"iteration": i, "instruction": f"instruction {i}", "response": f"response {i}", "checks": {"t": i > 8},
         "verdict": "continue"}
        for i in range(1, 11)
    ]
    out = compact_history(items, budget_tokens=1000, recent=3)
    for i in (8, 9, 10):
        assert f"Iteration {i}:" in out and f"response {i}" in out
    assert "- #1 continue; checks 0/1 (failing: t); did: instruction 1" in out
    assert "response 1\n" not in out and "response 7" not in out
    tiny = compact_history(items * 30, budget_tokens=200, recent=3)
    assert len(tiny) <= 200 * 4 + 200 and "not shown" in tiny
    assert compact_history([], budget_tokens=1000) == ""
