"""The metering gateway: an agent CLI's model calls are metered and hard-capped mid-act.

The "agent" is the real `anthropic` SDK in a scripted program run by the `command` brain in
the sandbox (no network: it reaches the gateway through the relay on its own loopback, which
pipes to the worker's unix socket). The local Messages server plays Anthropic and accepts only
the owner's stored key.
"""

import json
import threading

import anthropic
import pytest

from budgets import selectors
from budgets.models import Reservation
from instances import gateway
from instances.models import Credential
from loops import services
from loops.models import Event, Iteration, Run
from tests.fakes.messages_server import MessagesServer, Trickle, text
from tests.loops.conftest import Background, drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-GATEWAYTESTKEY-0123456789abcdefLMNO"

# The agent: call until refused; record what it saw (its environment, each answer) in the workspace.
AGENT = """
import anthropic
client = anthropic.Anthropic(max_retries=0)
pathlib.Path("env.json").write_text(json.dumps(dict(os.environ)))
seen = []
for n in range(int(os.environ.get("CALLS", "50"))):
    try:
        if os.environ.get("STREAM"):
            with client.messages.stream(model="claude-test-1", max_tokens=4000,
                                        messages=[{"role": "user", "content": "work"}]) as stream:
                message = stream.get_final_message()
        else:
            message = client.messages.create(model="claude-test-1", max_tokens=4000,
                                              messages=[{"role": "user", "content": "work"}])
        seen.append({"ok": message.content[0].text, "output_tokens": message.usage.output_tokens})
    except anthropic.APIStatusError as exc:
        seen.append({"status": exc.status_code, "body": exc.body})
        break
pathlib.Path("seen.json").write_text(json.dumps(seen))
print("made", len(seen), "calls")
"""


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


def answer_with(server, output_tokens):
    """Answer every call with text, writing `output_tokens` (never beyond the request's max_tokens)."""

    def respond(body):
        return text("working", usage={"output_tokens": min(output_tokens, int(body["max_tokens"]))})

    server.responder = respond


@pytest.fixture
def agent(user, make_instance, server, script, price):
    def build(body=AGENT, owner=None, **env):
        owner = owner or user
        credential = Credential.create_for(owner, label="mine", secret=KEY)
        inst = make_instance(
            owner, brain="command", decider="checks", base_url=server.url, credential=credential,
            model="claude-test-1", command=script(body), checks=[], max_iterations=1, env=env,
        )
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        return inst

    return build


def start(inst, cap="0.10"):
    return services.run_start(instance=inst, user=inst.owner, objective="work", max_cost_usd=cap)


def seen(inst):
    return json.loads((inst.workspace_path() / "seen.json").read_text())


def test_the_cap_holds_mid_act_and_the_agent_is_told_402(agent, server):
    answer_with(server, 3000)
    inst = agent()
    run = drive_in_thread(start(inst, cap="0.15"))  # $0.05 of it stays reserved for a self-report
    calls = seen(inst)
    assert calls[-1]["status"] == 402
    assert calls[-1]["body"]["error"]["type"] == "budget_exhausted"
    assert "cannot pay for another call" in calls[-1]["body"]["error"]["message"]
    assert len(calls) >= 3 and all("ok" in c for c in calls[:-1])
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED, run.outcome_detail
    assert 80_000 < run.spent_micros <= 100_000  # it worked until the cap
    asked = [r.body["max_tokens"] for r in server.requests]
    assert asked[0] == 4000 and asked[-1] < 4000  # the last call got what the headroom could pay
    metered = Reservation.objects.filter(run_id=run.pk, call__gt=0)
    assert metered.count() == server.calls
    assert sum(r.actual for r in metered) == run.spent_micros  # nothing self-reported, all metered
    assert all(r.model == "claude-test-1" and r.usage["output_tokens"] > 0 for r in metered)
    assert not Reservation.objects.filter(run_id=run.pk, status="held").exists()
    assert selectors.audit_pools() == []
    iteration = Iteration.objects.get(run=run)
    assert iteration.usage["output_tokens"] == sum(r.body["max_tokens"] if r.body["max_tokens"] < 3000 else 3000
                                                   for r in server.requests)


def test_the_real_key_never_reaches_the_agent(agent, server):
    answer_with(server, 50)
    inst = agent(CALLS="2")
    run = drive_in_thread(start(inst, cap="1.00"))
    assert run.status == "finished", run.outcome_detail
    env = (inst.workspace_path() / "env.json").read_text()
    environment = json.loads(env)
    assert KEY not in env and KEY[20:40] not in env
    assert environment["ANTHROPIC_API_KEY"].startswith(gateway.TOKEN_PREFIX)
    assert environment["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:")
    assert server.calls == 2 and all(r.headers["x-api-key"] == KEY for r in server.requests)
    iteration = Iteration.objects.get(run=run)
    recorded = json.dumps([e.data for e in Event.objects.filter(run=run)])
    recorded += iteration.response + iteration.act_detail + json.dumps(iteration.usage) + run.outcome_detail
    assert KEY not in recorded and KEY[20:40] not in recorded
    assert iteration.usage["calls"] == 2 and run.spent_micros > 0


def test_a_streaming_cli_is_metered_too(agent, server):
    answer_with(server, 3000)
    inst = agent(STREAM="1")
    run = drive_in_thread(start(inst, cap="0.15"))
    calls = seen(inst)
    assert calls[-1]["status"] == 402 and len(calls) >= 3
    assert all(r.body.get("stream") is True and r.streamed for r in server.requests)
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED and 80_000 < run.spent_micros <= 100_000
    metered = Reservation.objects.filter(run_id=run.pk, call__gt=0)
    assert [r.usage["output_tokens"] for r in metered.order_by("call")] == [
        min(3000, r.body["max_tokens"]) for r in server.requests
    ]
    assert selectors.audit_pools() == []


TOKEN_KEEPER = """
pathlib.Path("token.txt").write_text(os.environ["ANTHROPIC_API_KEY"] + "\\n" + os.environ["TETHER_GATEWAY_SOCKET"])
"""


def call_socket(path, token, *, stream=False, header="x-api-key"):
    """Call the gateway's unix socket with the real SDK, as an agent would."""
    import httpx2

    auth = {"api_key": token} if header == "x-api-key" else {"auth_token": token}  # the SDK's two ways
    http = httpx2.Client(transport=httpx2.HTTPTransport(uds=path))
    client = anthropic.Anthropic(**auth, base_url="http://gateway", http_client=http, max_retries=0)
    ask = dict(model="claude-test-1", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    if stream:
        with client.messages.stream(**ask) as streamed:
            return streamed.get_final_message()
    return client.messages.create(**ask)


def test_the_token_is_refused_after_the_act_ends_and_by_another_run(agent, server, other_user):
    inst = agent(TOKEN_KEEPER)
    run = drive_in_thread(start(inst, cap="1.00"))
    assert run.status == "finished", run.outcome_detail
    token, _ = (inst.workspace_path() / "token.txt").read_text().split("\n")
    path = gateway.serve()
    with pytest.raises(anthropic.AuthenticationError) as refused:
        call_socket(path, token)
    assert refused.value.status_code == 401 and "act has ended" in str(refused.value)
    assert server.calls == 0
    # Another user's run, live: the old token still cannot charge (or use) anything.
    answer_with(server, 10)
    spender = agent(AGENT, owner=other_user, CALLS="1")
    other = drive_in_thread(start(spender, cap="1.00"))
    assert other.status == "finished" and server.calls == 1
    with pytest.raises(anthropic.AuthenticationError):
        call_socket(path, token, header="bearer")
    assert server.calls == 1


def test_a_forged_or_foreign_token_gets_401(agent, server, settings):
    path = gateway.serve()
    for forged in ["sk-ant-api03-whatever", gateway.TOKEN_PREFIX + "e30:forged:signature", KEY]:
        with pytest.raises(anthropic.AuthenticationError):
            call_socket(path, forged)
    # A token signed with another server's secret.
    from django.core import signing

    other = gateway.TOKEN_PREFIX + signing.dumps({"run": 1, "it": 1, "n": "x", "s": path}, key="another-secret",
                                                 salt=gateway.SALT)
    with pytest.raises(anthropic.AuthenticationError):
        call_socket(path, other)
    assert server.calls == 0


LIVE = """
pathlib.Path("token.txt").write_text(os.environ["ANTHROPIC_API_KEY"] + "\\n" + os.environ["TETHER_GATEWAY_SOCKET"])
while not pathlib.Path("release").exists():
    time.sleep(0.05)
"""


def live_token(inst):
    """Wait for the live act to write its token; return it."""
    token_file = inst.workspace_path() / "token.txt"
    for _ in range(400):
        if token_file.exists() and "\n" in token_file.read_text():
            return token_file.read_text().split("\n")[0]
        threading.Event().wait(0.05)
    raise AssertionError("the act never started")


def test_a_live_token_works_from_outside_by_both_headers_and_counts_tokens(agent, server, tmp_path):
    """While its act runs, a token opens the gateway (x-api-key or Bearer), streamed or not, and count_tokens."""
    answer_with(server, 20)
    inst = agent(LIVE)
    run = start(inst, cap="1.00")
    driver = Background(run).start()
    try:
        token = live_token(inst)
        path = gateway.serve()
        assert call_socket(path, token).content[0].text == "working"
        assert call_socket(path, token, stream=True, header="bearer").usage.output_tokens == 20
        counted = _count(path, token)
        assert counted.input_tokens > 0
    finally:
        (inst.workspace_path() / "release").write_text("")
        driver.join(30)
    run.refresh_from_db()
    assert run.status == "finished", run.outcome_detail
    assert Reservation.objects.filter(run_id=run.pk, call__gt=0).count() == 2  # count_tokens is free
    assert Iteration.objects.get(run=run).usage["calls"] == 2


def _count(path, token):
    import httpx2

    http = httpx2.Client(transport=httpx2.HTTPTransport(uds=path))
    client = anthropic.Anthropic(api_key=token, base_url="http://gateway", http_client=http, max_retries=0)
    return client.messages.count_tokens(model="claude-test-1", messages=[{"role": "user", "content": "hi there"}])


def test_bad_input_is_a_4xx_in_the_error_shape(agent, server):
    inst = agent(LIVE)
    run = start(inst, cap="1.00")
    driver = Background(run).start()
    try:
        token = live_token(inst)
        cases = [
            (b"not json", 400), (b"[1, 2]", 400), (b'{"messages": []}', 400),
            (b'{"model": "claude-test-1", "max_tokens": "lots", "messages": []}', 400),
            (b'{"model": "claude-test-1", "max_tokens": 0, "messages": []}', 400),
            (b'{"model": "no-such-model", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}', 400),
        ]
        # What the provider would add on its side (and reach the network with) is not forwarded.
        ask = {"model": "claude-test-1", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
        unmeterable = [
            {**ask, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            {**ask, "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]},
            {**ask, "mcp_servers": [{"type": "url", "url": "https://example.com/mcp", "name": "x"}]},
            {**ask, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]},
            {**ask, "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
        ]
        cases += [(json.dumps(body).encode(), 400) for body in unmeterable]
        for raw, status in cases:
            answer = gateway.handle("POST", "/v1/messages", {"x-api-key": token}, raw)
            payload = json.loads(answer.body)
            assert answer.status == status, (raw, payload)
            assert payload["type"] == "error" and payload["error"]["message"]
        long_context = gateway.handle("POST", "/v1/messages", {"x-api-key": token, "anthropic-beta": "context-1m-2025-08-07"},
                                      json.dumps(ask).encode())
        assert long_context.status == 400 and b"context-1m" in long_context.body
        client_tools = {**ask, "tools": [{"type": "bash_20250124", "name": "bash"}, {"name": "mine", "input_schema": {}}]}
        assert gateway.unmeterable(client_tools, {}) == ""  # tools the agent runs itself are only tokens
        assert gateway.handle("GET", "/v1/messages", {"x-api-key": token}, b"").status == 405
        assert gateway.handle("POST", "/v1/models", {"x-api-key": token}, b"{}").status == 404
    finally:
        (inst.workspace_path() / "release").write_text("")
        driver.join(30)
    assert server.calls == 0


def call_web(token, *, stream=False):
    """Call the web view /gateway/anthropic/v1/messages with the real (async) SDK, through the ASGI app."""
    import asyncio

    import httpx2

    from tether.asgi import application

    async def go():
        base = "http://testserver/gateway/anthropic"
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application)) as http:
            client = anthropic.AsyncAnthropic(api_key=token, base_url=base, http_client=http, max_retries=0)
            ask = dict(model="claude-test-1", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
            if stream:
                async with client.messages.stream(**ask) as streamed:
                    return await streamed.get_final_message()
            return await client.messages.create(**ask)

    return asyncio.run(go())


def test_the_web_view_honours_a_live_token_only(agent, server):
    answer_with(server, 20)
    with pytest.raises(anthropic.AuthenticationError):
        call_web(gateway.TOKEN_PREFIX + "e30:forged:signature")
    inst = agent(LIVE)
    run = start(inst, cap="1.00")
    driver = Background(run).start()
    try:
        token = live_token(inst)
        assert call_web(token).content[0].text == "working"
        assert call_web(token, stream=True).usage.output_tokens == 20
    finally:
        (inst.workspace_path() / "release").write_text("")
        driver.join(30)
    with pytest.raises(anthropic.AuthenticationError):
        call_web(token)
    assert server.calls == 2
    assert Reservation.objects.filter(run_id=run.pk, call__gt=0).count() == 2


STREAMER = """
import anthropic
client = anthropic.Anthropic(max_retries=0)
with client.messages.stream(model="claude-test-1", max_tokens=4000,
                            messages=[{"role": "user", "content": "work"}]) as stream:
    for n, piece in enumerate(stream.text_stream):
        pathlib.Path("progress").write_text(str(n))
        if os.environ.get("LEAVE_AFTER") and n + 1 >= int(os.environ["LEAVE_AFTER"]):
            os._exit(0)  # the agent quits mid-stream: its act ends
"""


def cut_call(run):
    call = Reservation.objects.get(run_id=run.pk, call__gt=0)
    assert call.status != "held"
    return call


def test_a_stop_closes_the_upstream_stream_within_a_second_and_settles_what_arrived(agent, server, user):
    import time

    server.enqueue(Trickle(text("x" * 800, usage={"output_tokens": 3000}), every=0.1))
    inst = agent(STREAMER)
    run = start(inst, cap="1.00")
    driver = Background(run)
    driver.thread.start()
    for _ in range(400):
        if (inst.workspace_path() / "progress").exists():
            break
        time.sleep(0.05)
    services.run_cancel(run=run, user=user)
    driver.lease.stop.set()  # what the worker's driver does when it sees the cancel (loops.driver)
    assert server.disconnected.wait(5)  # the answer trickles far longer: the stop closed it
    driver.join(30)
    run.refresh_from_db()
    assert run.outcome == Run.Outcome.CANCELLED
    call = cut_call(run)
    assert 0 < call.usage["output_tokens"] < 3000 and call.usage["input_tokens"] > 0
    assert 0 < call.actual < call.amount and run.spent_micros == call.actual
    assert selectors.audit_pools() == []


def test_an_agent_that_quits_mid_stream_closes_the_upstream_and_pays_what_arrived(agent, server):
    server.enqueue(Trickle(text("x" * 800, usage={"output_tokens": 3000}), every=0.1))
    inst = agent(STREAMER, LEAVE_AFTER="3")
    run = drive_in_thread(start(inst, cap="1.00"))
    assert server.disconnected.wait(2)
    assert run.status == "finished", run.outcome_detail
    call = cut_call(run)
    assert 0 < call.usage["output_tokens"] < 3000
    assert 0 < call.actual < call.amount and run.spent_micros == call.actual
    assert server.requests[0].events_sent < 20
    assert selectors.audit_pools() == []


def test_the_web_view_answers_bad_requests_in_the_error_shape(client, settings, tmp_path):
    from django.core import signing

    url = "/gateway/anthropic/v1/messages"
    assert client.get(url).status_code == 405
    missing = client.post(url, data=b"{}", content_type="application/json")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    gone = gateway.TOKEN_PREFIX + signing.dumps({"run": 1, "it": 1, "n": "x", "s": str(tmp_path / "no.sock")},
                                                salt=gateway.SALT)
    ended = client.post(url, data=b"{}", content_type="application/json", HTTP_X_API_KEY=gone)
    assert ended.status_code == 401 and "act has ended" in ended.json()["error"]["message"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    big = client.post(url, data=b"{" + b" " * 500 + b"}", content_type="application/json", HTTP_X_API_KEY=gone)
    assert big.status_code == 413 and big.json()["type"] == "error"
