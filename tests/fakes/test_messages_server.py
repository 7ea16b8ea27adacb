"""The local Messages API fake streams and counts tokens as the real API does, seen through the real SDK."""

import threading
import time

import anthropic
import pytest

from tests.fakes.messages_server import Delay, MessagesServer, Trickle, text, tool_use

KEY = "sk-ant-fake-key"


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def client(server):
    return anthropic.Anthropic(api_key=KEY, base_url=server.url, max_retries=0)


def ask(client, **extra):
    return dict(model="claude-test-1", max_tokens=100, messages=[{"role": "user", "content": "hello there"}], **extra)


def test_a_streamed_text_reply_arrives_in_deltas_with_usage(client, server):
    server.enqueue(text("The answer is forty-two, of course."))
    with client.messages.stream(**ask(client)) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == "The answer is forty-two, of course."
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == server.requests[0].reply["usage"]["input_tokens"] > 0
    assert final.usage.output_tokens == server.requests[0].reply["usage"]["output_tokens"] > 0
    assert server.requests[0].streamed and server.requests[0].body["stream"] is True
    assert server.disconnects == 0


def test_a_streamed_tool_use_sends_its_input_as_json_deltas(client, server):
    server.enqueue(tool_use("write_file", {"path": "answer.txt", "content": "forty-two, written slowly"}, say="On it."))
    with client.messages.stream(**ask(client)) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds.count("input_json") > 1
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"path": "answer.txt", "content": "forty-two, written slowly"}
    assert final.stop_reason == "tool_use"


def test_events_follow_the_api_order():
    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
        "stop_sequence": None, "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": 5, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }
    kinds = [event["type"] for event in MessagesServer.events(message)]
    assert kinds == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    events = MessagesServer.events(message)
    assert events[0]["message"]["usage"]["input_tokens"] == 5
    assert events[-2]["usage"] == {"output_tokens": 3}


def test_a_delayed_stream_waits_then_streams(client, server):
    server.enqueue(Delay(0.3, text("late")))
    started = time.monotonic()
    with client.messages.stream(**ask(client)) as stream:
        assert stream.get_final_text() == "late"
    assert time.monotonic() - started >= 0.3


def test_a_trickle_is_slow_and_a_client_that_goes_away_is_seen_at_once(client, server):
    server.enqueue(Trickle(text("x" * 400), every=0.2))
    got = []
    with client.messages.stream(**ask(client)) as stream:
        for piece in stream.text_stream:
            got.append(piece)
            if len(got) == 2:
                break
    assert server.disconnected.wait(15)  # the whole trickle would take 20 s
    assert server.disconnects == 1
    received = server.requests[0]
    assert received.disconnected and 2 < received.events_sent < 20


def test_a_client_closing_during_a_delay_is_seen(server):
    server.enqueue(Delay(30, text("never")))
    client = anthropic.Anthropic(api_key=KEY, base_url=server.url, max_retries=0, timeout=0.3)
    with pytest.raises(anthropic.APITimeoutError):
        client.messages.create(**ask(client))
    assert server.disconnected.wait(20)  # before the 30 s delay ends


def test_a_full_trickle_completes(client, server):
    server.enqueue(Trickle(text("slow but sure"), every=0.01, size=2))
    with client.messages.stream(**ask(client)) as stream:
        assert stream.get_final_text() == "slow but sure"
    assert server.requests[0].events_sent == len(MessagesServer.events(server.requests[0].reply, size=2))


def test_count_tokens_counts_the_input_and_caches_nothing(client, server):
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 40, "cache_control": {"type": "ephemeral"}}]}]
    counted = client.messages.count_tokens(model="claude-test-1", messages=messages)
    assert server.requests[0].path.startswith("/v1/messages/count_tokens")
    server.enqueue(text("ok"))
    created = client.messages.create(model="claude-test-1", max_tokens=10, messages=messages)
    assert counted.input_tokens == created.usage.cache_creation_input_tokens > 0  # counting cached nothing


def test_count_tokens_without_messages_is_a_400(client):
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="claude-test-1", messages=[])


def test_streams_run_concurrently(server):
    server.enqueue(Trickle(text("a" * 40), every=0.05), Trickle(text("b" * 40), every=0.05))
    client = anthropic.Anthropic(api_key=KEY, base_url=server.url, max_retries=0)
    results = {}
    # Each stream reads on only once both have begun: served one after the other, they never both begin.
    both_begun = threading.Barrier(2, timeout=30)

    def consume(name):
        with client.messages.stream(**ask(client)) as stream:
            parts = []
            for part in stream.text_stream:
                if not parts:
                    both_begun.wait()
                parts.append(part)
            results[name] = "".join(parts)

    threads = [threading.Thread(target=consume, args=(n,)) for n in "12"]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(results.values()) == ["a" * 40, "b" * 40]
