"""Tether over MCP (streamable HTTP at /mcp): the `mcp` client SDK against a real `serve` (or daphne).

A client lists the tools, starts a command-brain run, follows its events after a seq,
interjects (the agent hears it), and cancels; each action is audited with interface `mcp`.
A session held idle still answers.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import anyio
import pytest
from django.conf import settings

from audit.models import AuditEntry
from loops.models import Run
from tests.browser.conftest import Server, free_port, log_tail
from tests.support.cluster import worker_env
from tests.support.mcp import TOOLS, call, http_client, refused
from web.auth import make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def server(tmp_path):
    started = Server(tmp_path)
    yield started
    started.stop()
    print(f"--- daphne log (tail) ---\n{log_tail(started.log_path)}")  # shown when the test fails


@pytest.fixture(scope="module")
def serve(tmp_path_factory, django_db_setup):
    """`python manage.py serve` (daphne and a worker cluster) on the test database; yields its URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
            cwd=settings.BASE_DIR, env=worker_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    ends = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"serve exited: {log_tail(log_path)}"
        assert time.monotonic() < ends, f"serve did not answer: {log_tail(log_path)}"
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                break
        except OSError:
            time.sleep(0.2)
    yield url
    proc.send_signal(signal.SIGTERM)  # serve stops its children; a SIGTERM to the group would hang qcluster
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
    print(f"--- serve log (tail) ---\n{log_tail(log_path)}")  # shown when the test fails


@pytest.fixture
def writer(user, make_instance, script):
    """A command agent that drafts one section per act (and notes a summary when asked); never done."""
    agent = script(
        """
        count = pathlib.Path('count')
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        instruction = sys.stdin.read()
        time.sleep(0.5)
        print(f'pass {n}: drafted section {n}')
        if 'summary' in instruction:
            print('noted: a summary at the end')
        """
    )
    check = script("print('sections', pathlib.Path('count').read_text()); sys.exit(1)")
    return make_instance(
        user, name="report-writer", command=agent, checks=[{"name": "never", "command": check}], max_iterations=50
    )


async def wait_for_event(client, run_id, after, predicate, timeout=60.0):
    """Follow the run's events from `after` until one matches; return (every event read, the match)."""
    seen = []
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        page = await call(client, "run_events", run_id=run_id, after=after)
        assert all(e["seq"] > after for e in page["events"])
        seen.extend(page["events"])
        after = page["last_seq"]
        for event in page["events"]:
            if predicate(event):
                return seen, event
        await anyio.sleep(0.2)
    raise AssertionError(f"no matching event within {timeout}s; saw {[e['kind'] for e in seen]}")


def test_a_client_starts_follows_interjects_and_cancels_a_run(serve, user, writer):
    token = make_token(user, name="desktop")

    async def session():
        async with http_client(serve, token) as client:
            listed = await client.list_tools()
            names = {tool.name for tool in listed.tools}
            assert TOOLS <= names
            assert all(tool.description for tool in listed.tools)
            instances = await call(client, "list_instances")
            assert [i["name"] for i in instances["instances"]] == ["report-writer"]

            run = await call(client, "start_run", instance="report-writer", objective="Draft the report")
            assert run["status"] == "queued" and run["instance"] == writer.pk
            run_id = run["id"]

            events, first_act = await wait_for_event(client, run_id, 0, lambda e: e["kind"] == "act.finished")
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # every event once, in order
            assert "pass 1" in first_act["data"]["response"]
            after = first_act["seq"]
            later = await call(client, "run_events", run_id=run_id, after=after, limit=1)
            assert [e["seq"] for e in later["events"]] == [after + 1]

            queued = await call(client, "interject", run_id=run_id, message="Also write a summary at the end")
            assert queued["interjection"] > 0
            _, heard = await wait_for_event(
                client, run_id, after, lambda e: e["kind"] == "act.finished" and "noted" in e["data"]["response"]
            )
            assert heard["seq"] > after

            stopped = await call(client, "cancel", run_id=run_id)
            assert stopped["stop_requested"] is True
            ends = time.monotonic() + 5
            while (now := await call(client, "get_run", run_id=run_id))["status"] != "finished":
                assert time.monotonic() < ends, f"the run did not stop: {now}"
                await anyio.sleep(0.1)
            assert now["outcome"] == "cancelled" and now["budget"] is not None
            again = await refused(client, "cancel", run_id=run_id)
            assert "already finished" in again
            runs = await call(client, "list_runs", instance=writer.pk, status="finished")
            assert [r["id"] for r in runs["runs"]] == [run_id]
            return run_id

    run_id = anyio.run(session)
    run = Run.objects.get(pk=run_id)
    assert run.outcome == Run.Outcome.CANCELLED
    audited = AuditEntry.objects.filter(run_ref=run_id).order_by("id")
    assert [(a.action, a.via, a.username) for a in audited] == [
        ("run.start", "mcp", "ada"),
        ("run.interject", "mcp", "ada"),
        ("run.stop", "mcp", "ada"),
    ]
    assert all(a.ip_address == "127.0.0.1" and a.user_agent for a in audited)
    started = run.events.get(kind="run.started")
    assert started.data["via"] == "mcp"


def test_a_session_held_idle_still_answers_and_the_server_still_stops(server, user, writer):
    token = make_token(user)

    async def session():
        # "legacy": the handshake-era protocol, with an Mcp-Session-Id the server keeps between requests.
        async with http_client(server.url, token, mode="legacy") as client:
            assert (await call(client, "list_instances"))["instances"][0]["name"] == "report-writer"
            await anyio.sleep(11)
            assert (await call(client, "list_instances"))["instances"][0]["name"] == "report-writer"
            assert (await call(client, "list_runs"))["runs"] == []

    anyio.run(session)
    # Nothing the session started (its task group, the threads its tools ran in) holds the server up.
    server.proc.terminate()
    server.proc.wait(timeout=5)


def test_bad_arguments_are_readable_tool_errors(server, user, writer):
    token = make_token(user)

    async def session():
        async with http_client(server.url, token) as client:
            return [
                await refused(client, "get_run", run_id="abc"),
                await refused(client, "run_events", run_id=1, after=-1),
                await refused(client, "get_run", run_id=2**70),
                await refused(client, "start_run", instance="report-writer", objective="   "),
                await refused(client, "start_run", instance="report-writer", objective="x", max_cost_usd="lots"),
                await refused(client, "start_run", instance="nobody", objective="x"),
                await refused(client, "answer", run_id=1, message="yes"),
            ]

    errors = anyio.run(session)
    assert errors[0] == "bad arguments for get_run: run_id: Input should be a valid integer, unable to parse string as an integer"
    assert errors[1].startswith("bad arguments for run_events: after: Input should be greater than or equal to 0")
    assert errors[2].startswith("bad arguments for get_run: run_id: Input should be less than or equal to")
    assert errors[3] == "missing required field(s): objective"  # what REST answers for a blank objective
    assert "max_cost_usd must be a number of US dollars" in errors[4]
    assert "instance 'nobody' not found" in errors[5]
    assert "run 1 not found" in errors[6]
    assert not any("Traceback" in e or 'File "' in e for e in errors)
    assert not Run.objects.exists()


def test_a_run_that_asks_a_person_is_answered_and_finishes(serve, user, make_instance, script):
    asker = script(
        """
        if 'blue' not in sys.stdin.read():
            print('TETHER_ESCALATE: Which colour should the logo be?', file=sys.stderr)
            sys.exit(3)
        pathlib.Path('logo.txt').write_text('blue')
        print('painted it blue')
        """
    )
    check = script("sys.exit(0 if pathlib.Path('logo.txt').exists() else 1)")
    make_instance(user, name="painter", command=asker, checks=[{"name": "logo", "command": check}])
    token = make_token(user)

    async def until(client, run_id, status):
        ends = time.monotonic() + 60
        while (run := await call(client, "get_run", run_id=run_id))["status"] != status:
            assert time.monotonic() < ends, f"run never became {status}: {run}"
            await anyio.sleep(0.2)
        return run

    async def session():
        async with http_client(serve, token) as client:
            run_id = (await call(client, "start_run", instance="painter", objective="Paint the logo"))["id"]
            early = await refused(client, "answer", run_id=run_id, message="blue")  # not asked yet
            waiting = await until(client, run_id, "waiting")
            empty = await refused(client, "answer", run_id=run_id)
            answered = await call(client, "answer", run_id=run_id, message="Make it blue")
            finished = await until(client, run_id, "finished")
            return run_id, early, waiting, empty, answered, finished

    run_id, early, waiting, empty, answered, finished = anyio.run(session)
    assert "is not waiting for an answer" in early
    assert "Which colour" in waiting["outcome_detail"]
    assert "give a message" in empty
    assert answered["run"]["status"] == "queued"
    assert (finished["outcome"], finished["verified"]) == ("done", True)
    actions = AuditEntry.objects.filter(run_ref=run_id).values_list("action", "via")
    assert list(actions.order_by("id")) == [("run.start", "mcp"), ("run.answer", "mcp")]
