"""Traces: each run is one OpenTelemetry trace, sent over OTLP/HTTP to a real receiver the test starts.

The receiver is a small HTTP server decoding the OTLP protobuf the SDK's exporter posts. The runs are
driven through the real runner: a Claude agent played by the local Messages server (model and tool
calls, an MCP server's tool), a command agent calling models through the metering gateway, and a
command agent whose run moves to another driver, with a fresh tracer as after a restart, between
its iterations, or whose worker dies mid-iteration. With the receiver down the run still ends the
same, and the spans that could not be sent are counted on /metrics.
"""

import gzip
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from instances.brains.base import Usage, trace_call
from instances.models import Credential
from instances.templates_loader import create_instance
from loops import leases, lifecycle, runner, services
from loops.models import Event, Run
from tests.fakes.messages_server import text, tool_use
from tests.instances.conftest import KEY
from tests.instances.test_mcp_tools import TOKEN, mcp_agent, notes  # noqa: F401 - fixtures
from tether import tracing

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MODEL = "claude-test-1"
SECRET_PROMPT = "the objective mentions sk-ant-api03-TETHERTESTKEY-0123456789abcdefXYZW by mistake"


class Receiver:
    """An OTLP/HTTP trace receiver: every span posted to /v1/traces, decoded."""

    def __init__(self):
        self.spans = []
        self.bodies = []
        self.arrived = threading.Event()  # a post came in
        self.released = threading.Event()  # posts are answered (clear it to hold them)
        self.released.set()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.arrived.set()
                received.released.wait(60)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                received.bodies.append(body)
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        received.spans.extend(scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def attrs(span):
    found = {}
    for kv in span.attributes:
        value = kv.value
        found[kv.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return found


@pytest.fixture
def receiver(monkeypatch):
    running = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", running.url)
    tracing.reset()
    yield running
    tracing.reset()
    running.close()


@pytest.fixture
def claude_agent(user, server, tmp_path, price):
    key = Credential.create_for(user, label="mine", secret=KEY)
    values = {
        "base_url": server.url,
        "credential_id": key.pk,
        "model": MODEL,
        "workspace": str(tmp_path / "ws"),
        "checks": [],
        "decider": "checks",
        "max_iterations": 2,
    }
    inst = create_instance(owner=user, template="coder", name="coder", overrides=values)
    inst.workspace_path().mkdir(parents=True, exist_ok=True)
    usage = {"input_tokens": 120, "output_tokens": 30}
    server.enqueue(tool_use("write_file", {"path": "answer.py", "content": "ANSWER = 42\n"}, usage=usage))
    server.enqueue(text("Wrote answer.py.", usage=usage))
    return inst


def drive(run, holder="test-driver", slice_seconds=3600.0):
    lease = leases.claim(run.pk, run.next_iteration, holder)
    assert lease is not None
    runner.drive(lease, slice_seconds=slice_seconds)
    run.refresh_from_db()
    return run


def test_a_run_is_one_trace_with_nested_spans_and_genai_attributes(receiver, claude_agent):
    run = drive(services.run_start(instance=claude_agent, user=claude_agent.owner, objective=SECRET_PROMPT))
    assert run.outcome == "done", run.outcome_detail
    assert tracing.flush()
    spans = {span.name: span for span in receiver.spans}
    assert {
        f"run {run.pk}",
        "iteration 1",
        "act",
        "checks",
        "decider",
        "judge",
        f"chat {MODEL}",
        "execute_tool write_file",
    } <= set(spans)
    assert len({span.trace_id for span in receiver.spans}) == 1

    def parent(name):
        return next(s.name for s in receiver.spans if s.span_id == spans[name].parent_span_id)

    assert spans[f"run {run.pk}"].parent_span_id == b""
    assert parent("iteration 1") == f"run {run.pk}"
    assert parent("act") == parent("checks") == parent("decider") == parent("judge") == "iteration 1"
    assert parent(f"chat {MODEL}") == parent("execute_tool write_file") == "act"

    calls = [attrs(s) for s in receiver.spans if s.name == f"chat {MODEL}"]
    assert len(calls) == 2
    call = calls[0]
    assert call["gen_ai.system"] == "anthropic" and call["gen_ai.request.model"] == MODEL
    assert call["gen_ai.operation.name"] == "chat"
    assert (call["gen_ai.usage.input_tokens"], call["gen_ai.usage.output_tokens"]) == (120, 30)
    assert call["tether.cost_usd"] > 0
    assert sum(c["tether.cost_usd"] for c in calls) == pytest.approx(run.spent_micros / 1_000_000)
    assert attrs(spans[f"run {run.pk}"])["tether.outcome"] == "done"
    # No prompt or completion text by default, and no key anywhere.
    sent = b"".join(receiver.bodies)
    assert b"gen_ai.input.messages" not in sent and b"mentions" not in sent and b"Wrote answer.py" not in sent
    assert KEY.encode() not in sent


def test_prompt_text_goes_only_when_allowed_and_then_redacted(receiver, claude_agent, settings):
    settings.TETHER_OTEL_CAPTURE_CONTENT = True
    run = drive(services.run_start(instance=claude_agent, user=claude_agent.owner, objective=SECRET_PROMPT))
    assert run.outcome == "done" and tracing.flush()
    call = next(attrs(s) for s in receiver.spans if s.name == f"chat {MODEL}")
    assert "mentions" in call["gen_ai.input.messages"]
    assert KEY not in call["gen_ai.input.messages"] and KEY.encode() not in b"".join(receiver.bodies)


def test_an_mcp_server_s_secret_never_reaches_a_span(receiver, notes, mcp_agent, server, settings):  # noqa: F811
    """With content captured, what the model wrote (its tool call's input) is redacted of the server's secret too."""
    settings.TETHER_OTEL_CAPTURE_CONTENT = True
    notes(everyone=True)
    server.enqueue(
        tool_use("mcp__notes__lookup", {"term": f"the token {TOKEN}"}),
        text(f"Looked up {TOKEN}."),
        tool_use("record_decision", {"verdict": "done", "reason": "looked"}),
    )
    inst = mcp_agent()
    run = drive(services.run_start(instance=inst, user=inst.owner, objective="look the notes up"))
    assert run.outcome == "done", run.outcome_detail
    assert tracing.flush()
    captured = [attrs(s) for s in receiver.spans if s.name == f"chat {MODEL}"]
    assert any("the token" in c.get("gen_ai.output.messages", "") for c in captured)  # content was captured
    assert any("Looked up" in c.get("gen_ai.input.messages", "") for c in captured)
    assert TOKEN.encode() not in b"".join(receiver.bodies)
    assert not [s.name for s in receiver.spans if any(TOKEN in str(v) for v in attrs(s).values())]


GATEWAY_AGENT = """
import anthropic
client = anthropic.Anthropic(max_retries=0)
client.messages.create(model="claude-test-1", max_tokens=500, messages=[{"role": "user", "content": "plain call"}])
with client.messages.stream(model="claude-test-1", max_tokens=500,
                            messages=[{"role": "user", "content": "streamed call"}]) as stream:
    stream.get_final_message()
print("made two calls")
"""


def test_a_command_agent_s_gateway_calls_are_model_call_spans_of_its_act(
    receiver, user, make_instance, script, server, price, settings
):
    settings.TETHER_OTEL_CAPTURE_CONTENT = True
    credential = Credential.create_for(user, label="k", secret=KEY)
    inst = make_instance(
        user, brain="command", decider="checks", base_url=server.url, credential=credential, model=MODEL,
        command=script(GATEWAY_AGENT), checks=[], max_iterations=1,
    )
    inst.workspace_path().mkdir(parents=True, exist_ok=True)
    server.enqueue(
        text("plain answer", usage={"input_tokens": 70, "output_tokens": 20}),
        text("streamed answer", usage={"input_tokens": 90, "output_tokens": 40}),
    )
    run = drive(services.run_start(instance=inst, user=user, objective="call twice", max_cost_usd="1.00"))
    assert run.outcome == "done", run.outcome_detail
    assert server.calls == 2 and tracing.flush()
    assert len({span.trace_id for span in receiver.spans}) == 1
    [act] = [s for s in receiver.spans if s.name == "act"]
    calls = [s for s in receiver.spans if s.name == f"chat {MODEL}"]
    assert len(calls) == 2 and all(s.parent_span_id == act.span_id for s in calls)
    plain, streamed = sorted((attrs(s) for s in calls), key=lambda c: c["gen_ai.usage.input_tokens"])
    assert (plain["gen_ai.usage.input_tokens"], plain["gen_ai.usage.output_tokens"]) == (70, 20)
    assert (streamed["gen_ai.usage.input_tokens"], streamed["gen_ai.usage.output_tokens"]) == (90, 40)
    assert plain["gen_ai.request.model"] == MODEL and plain["gen_ai.system"] == "anthropic"
    assert plain["gen_ai.response.finish_reasons"] and streamed["gen_ai.response.id"]
    assert sum(c["tether.cost_usd"] for c in (plain, streamed)) == pytest.approx(run.spent_micros / 1_000_000)
    assert "plain call" in plain["gen_ai.input.messages"] and "plain answer" in plain["gen_ai.output.messages"]
    assert "streamed answer" in streamed["gen_ai.output.messages"]
    assert all(s.status.code != s.status.STATUS_CODE_ERROR for s in calls)
    sent = b"".join(receiver.bodies)
    assert KEY.encode() not in sent and b"tether-gateway-" not in sent


def test_a_refused_gateway_call_is_an_error_span_without_content_by_default(receiver, user, make_instance, script, server, price):
    credential = Credential.create_for(user, label="k", secret=KEY)
    inst = make_instance(
        user, brain="command", decider="checks", base_url=server.url, credential=credential, model=MODEL,
        command=script(GATEWAY_AGENT), checks=[], max_iterations=1,
    )
    inst.workspace_path().mkdir(parents=True, exist_ok=True)
    server.enqueue_error(529, "overloaded")
    drive(services.run_start(instance=inst, user=user, objective="call", max_cost_usd="1.00"))
    assert tracing.flush()
    [call] = [s for s in receiver.spans if s.name == f"chat {MODEL}"]
    assert call.status.code == call.status.STATUS_CODE_ERROR and "529" in call.status.message
    assert attrs(call)["http.response.status_code"] == 529
    assert "gen_ai.input.messages" not in attrs(call) and b"plain call" not in b"".join(receiver.bodies)  # content off


AGENT = """
calc = pathlib.Path('n.txt')
calc.write_text(str(int(calc.read_text() if calc.exists() else '0') + 1))
"""
CHECK = "sys.exit(0 if pathlib.Path('n.txt').read_text() == '2' else 1)\n"


def test_a_run_moved_to_another_worker_and_its_child_are_one_trace(receiver, user, make_instance, script):
    inst = make_instance(
        user, command=script(AGENT), checks=[{"name": "two", "command": script(CHECK)}], max_iterations=3
    )
    run = services.run_start(instance=inst, user=user, objective="count to two")
    run = drive(run, holder="worker-1", slice_seconds=0)  # one iteration, then handed back
    assert run.status != "finished" and run.iterations_done == 1
    tracing.reset()  # a restart: a new tracer, nothing kept in the process
    run = drive(run, holder="worker-2")
    assert (run.outcome, run.iterations_done) == ("done", 2)
    assert tracing.flush()
    names = [span.name for span in receiver.spans]
    assert names.count(f"run {run.pk}") == 1 and names.count("iteration 1") == names.count("iteration 2") == 1
    assert len({span.trace_id for span in receiver.spans}) == 1
    run_span = next(s for s in receiver.spans if s.name == f"run {run.pk}")
    iterations = [s for s in receiver.spans if s.name.startswith("iteration")]
    assert all(s.parent_span_id == run_span.span_id for s in iterations)


def test_an_iteration_whose_worker_died_is_in_the_trace_as_lost(receiver, user, make_instance, script):
    inst = make_instance(
        user, command=script(AGENT), checks=[{"name": "two", "command": script(CHECK)}], max_iterations=3
    )
    run = services.run_start(instance=inst, user=user, objective="count to two")
    lease = leases.claim(run.pk, run.next_iteration, "dying-worker")
    begun = runner._begin(lease)  # iteration 1 begins: recorded, reserved

    inside, never = threading.Event(), threading.Event()

    def die_inside_the_span():  # the worker's iteration span opens and never ends while it is traced
        with tracing.iteration(lambda: lifecycle.trace_ids(begun.run), run.pk, begun.number, begun.run.attempt):
            inside.set()
            never.wait(120)

    threading.Thread(target=die_inside_the_span, daemon=True).start()
    assert inside.wait(30)
    tracing.reset()  # the process is gone, with its open span
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    run = drive(run, holder="worker-2")  # takes the dead lease over: the attempt is recorded lost
    assert (run.outcome, run.iterations_done) == ("done", 2), run.outcome_detail
    assert tracing.flush()

    assert len({span.trace_id for span in receiver.spans}) == 1
    run_span = next(s for s in receiver.spans if s.name == f"run {run.pk}")
    firsts = [s for s in receiver.spans if s.name == "iteration 1"]
    assert len(firsts) == 2 and all(s.parent_span_id == run_span.span_id for s in firsts)
    [lost] = [s for s in firsts if s.status.code == s.status.STATUS_CODE_ERROR]
    assert lost.status.message == "worker lost"
    assert attrs(lost)["tether.worker"] == "dying-worker" and attrs(lost)["tether.attempt"] == 1
    began = Event.objects.get(run=run, kind="iteration.started", data__iteration=1, data__attempt=1).created_at
    assert lost.start_time_unix_nano == int(began.timestamp() * 1_000_000_000)
    assert lost.start_time_unix_nano <= lost.end_time_unix_nano
    [retried] = [s for s in firsts if s is not lost]
    assert lost.end_time_unix_nano <= retried.start_time_unix_nano
    never.set()  # (its span ends now, in a tracer long shut down: nothing more is sent)


def test_a_delegated_run_moved_across_a_restart_is_one_trace(
    receiver, user, make_instance, script, server, price
):
    credential = Credential.create_for(user, label="k", secret=KEY)
    lead = make_instance(
        user,
        name="lead",
        brain="anthropic",
        decider="checks",
        base_url=server.url,
        credential=credential,
        model=MODEL,
        tools=["write_file", "delegate"],
        command=[],
        max_iterations=4,
        checks=[
            {
                "name": "report",
                "command": script("sys.exit(0 if pathlib.Path('REPORT.md').exists() else 1)\n"),
            }
        ],
    )
    lead.workspace_path().mkdir(parents=True, exist_ok=True)
    make_instance(user, name="helper", command=script("print('I helped')\n"))
    server.enqueue(
        tool_use("delegate", {"to": "helper", "objective": "help", "max_cost_usd": 0.2, "workspace": "own"}),
        tool_use("write_file", {"path": "REPORT.md", "content": "the helper helped"}),
        text("The report is written."),
    )
    run = services.run_start(instance=lead, user=user, objective="write the report", max_cost_usd="1.00")
    run = drive(run, holder="worker-1")
    assert run.status == "waiting", run.outcome_detail
    [child] = type(run).objects.filter(parent=run)
    assert drive(child, holder="worker-1").outcome == "done"
    tracing.reset()  # the parent resumes after a restart, on another worker
    run = drive(run, holder="worker-2")
    assert run.outcome == "done", run.outcome_detail
    assert tracing.flush()

    spans = receiver.spans
    assert len({span.trace_id for span in spans}) == 1
    by_id = {span.span_id: span for span in spans}
    [parent_span] = [s for s in spans if s.name == f"run {run.pk}"]
    [child_span] = [s for s in spans if s.name == f"run {child.pk}"]
    assert parent_span.parent_span_id == b"" and child_span.parent_span_id == parent_span.span_id
    iterations = [s for s in spans if s.name.startswith("iteration")]
    assert sorted(by_id[s.parent_span_id].name for s in iterations) == sorted(
        [f"run {run.pk}", f"run {run.pk}", f"run {child.pk}"]
    )
    # A delegate call ends the act (the loop starts the child): the tool spans are the other calls'.
    assert any(s.name == "execute_tool write_file" for s in spans)
    calls = [attrs(s) for s in spans if s.name == f"chat {MODEL}"]
    assert len(calls) == 3 and all(
        c["gen_ai.request.model"] == MODEL and "tether.cost_usd" in c for c in calls
    )
    sent = b"".join(receiver.bodies)
    assert KEY.encode() not in sent and b"the helper helped" not in sent and b"write the report" not in sent


def test_a_down_collector_neither_fails_the_run_nor_goes_uncounted(
    monkeypatch, user, make_instance, script, settings, client
):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    settings.TETHER_METRICS_TOKEN = "metrics-token"
    tracing.reset()
    try:
        before = tracing.dropped()
        inst = make_instance(user, command=script("print('hi')"), max_iterations=1)
        run = drive(services.run_start(instance=inst, user=user, objective="say hi"))
        assert run.outcome == "done"
        tracing.flush()
        assert tracing.dropped() > before
        page = client.get("/metrics", headers={"Authorization": "Bearer metrics-token"}).content.decode()
        assert f"tether_trace_spans_dropped_total {tracing.dropped()}" in page
    finally:
        tracing.reset()


def test_spans_a_full_queue_turns_away_are_counted(receiver, monkeypatch, settings, client):
    queue = 3
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(queue))
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")  # each span ended wakes the sender
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # ... and nothing else does
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "60")
    settings.TETHER_METRICS_TOKEN = "metrics-token"
    tracing.reset()
    receiver.released.clear()  # the collector takes the first post and holds it
    try:
        with tracing.span("first"):
            pass
        assert receiver.arrived.wait(30)  # the sender is stuck on that post: nothing leaves the queue
        before = tracing.dropped()
        for number in range(queue + 4):
            with tracing.span(f"span {number}"):
                pass
        assert tracing.dropped() - before == 4
        page = client.get("/metrics", headers={"Authorization": "Bearer metrics-token"}).content.decode()
        assert f"tether_trace_spans_dropped_total {tracing.dropped()}" in page
    finally:
        receiver.released.set()
    assert tracing.flush(30)
    assert tracing.dropped() - before == 4  # the queued spans then went through: nothing more lost
    assert len(receiver.spans) == 1 + queue


def test_a_call_s_messages_are_serialised_only_when_content_is_captured(receiver, settings):
    """With content capture off (the default), a model call's messages are never turned into text."""

    class Unprintable:
        def __str__(self):
            raise AssertionError("serialised although content capture is off")

    messages = {"messages": [{"role": "user", "content": [Unprintable()]}], "max_tokens": 5}
    answer = {"id": "msg_1", "content": [Unprintable()], "stop_reason": "end_turn"}
    with tracing.model_call("anthropic", MODEL) as traced:
        trace_call(traced, messages, Usage(input_tokens=3, output_tokens=2), 10, answer)
    assert tracing.flush()
    call = next(attrs(s) for s in receiver.spans if s.name == f"chat {MODEL}")
    assert call["gen_ai.usage.input_tokens"] == 3 and "gen_ai.input.messages" not in call

    settings.TETHER_OTEL_CAPTURE_CONTENT = True  # captured: serialised (str() of what JSON cannot hold)
    with pytest.raises(AssertionError, match="serialised"), tracing.model_call("anthropic", MODEL) as traced:
        trace_call(traced, messages, Usage(), 0, answer)
