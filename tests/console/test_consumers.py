"""The console's websockets through the real ASGI stack (origin check, session auth, routing)."""

import asyncio
import re

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.console.conftest import record

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")
SEQ = re.compile(r'^<div hx-swap-oob="beforeend:#run-(\d+)-timeline" data-seq="(\d+)">')


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def socket(path, cookie=None, origin=ORIGIN):
    from tether.asgi import application

    headers = [HOST, origin] if origin else [HOST]
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


def run_async(coro):
    return asyncio.run(coro)


async def receive_events(ws, count, timeout=5.0):
    """Receive messages until `count` event messages came; return [(seq, html)] and the state messages."""
    found, states = [], []
    while len(found) < count:
        message = await ws.receive_from(timeout=timeout)
        match = SEQ.match(message)
        if match:
            found.append((int(match.group(2)), message))
        else:
            states.append(message)
    return found, states


def test_replays_the_events_after_the_clients_seq_then_the_runs_state(user, run):
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after=3", cookie)
        connected, _ = await ws.connect()
        assert connected
        found, _ = await receive_events(ws, run.last_seq - 3)
        state = await ws.receive_from(timeout=5)
        assert await ws.receive_nothing(timeout=0.6)
        await ws.disconnect()
        return found, state

    found, state = run_async(go())
    assert [seq for seq, _ in found] == list(range(4, run.last_seq + 1))
    assert f'id="run-{run.pk}-summary"' in state and 'hx-swap-oob="true"' in state
    assert f'id="run-{run.pk}-chart"' in state and f'id="run-{run.pk}-budget"' in state


def test_a_pushed_event_is_the_same_fragment_the_page_draws(user, run):
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after=0", cookie)
        await ws.connect()
        found, _ = await receive_events(ws, run.last_seq)
        await ws.disconnect()
        return found

    found = run_async(go())
    client = Client()
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    for seq, message in found:
        article = re.search(rf'<article [^>]*data-seq="{seq}".*?</article>', message, re.S).group(0)
        assert article in page, f"event {seq} is drawn differently on the page and in the socket"


def test_delivers_new_events_live_without_duplicates(user, run):
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", cookie)
        connected, _ = await ws.connect()
        assert connected
        assert await ws.receive_nothing(timeout=0.5)
        await database_sync_to_async(record)(
            run, [("interjection.queued", {"id": 9, "text": "hello", "by": "ada"})]
        )
        found, states = await receive_events(ws, 1, timeout=3)
        await database_sync_to_async(record)(
            run,
            [
                ("run.stop_requested", {"by": "ada"}),
                ("run.finished", {"outcome": "cancelled", "detail": "stopped"}),
            ],
        )
        more, _ = await receive_events(ws, 2, timeout=3)
        await ws.receive_from(timeout=3)  # the state after the batch
        assert await ws.receive_nothing(timeout=0.6)
        await ws.disconnect()
        return found + more

    found = run_async(go())
    first = run.last_seq
    assert [seq for seq, _ in found] == [first + 1, first + 2, first + 3]
    assert "hello" in found[0][1] and "Stopped by ada" in found[2][1]


def test_a_reconnecting_client_resumes_from_its_last_seq(user, run):
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after=0", cookie)
        await ws.connect()
        before, _ = await receive_events(ws, run.last_seq)
        await ws.disconnect()
        # Events recorded while the client was away (a phone locked, a laptop asleep).
        await database_sync_to_async(record)(
            run, [("run.claimed", {"iteration": 2, "worker": "w2", "attempt": 1})] * 3
        )
        again = socket(f"/ws/runs/{run.pk}/?after={before[-1][0]}", cookie)
        await again.connect()
        after, _ = await receive_events(again, 3)
        await again.receive_from(timeout=3)  # the run's state after the batch
        assert await again.receive_nothing(timeout=0.6)  # and nothing twice
        await again.disconnect()
        return before + after

    seqs = [seq for seq, _ in run_async(go())]
    assert seqs == list(range(1, run.last_seq + 4))


def test_a_bad_after_replays_everything(user, run):
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after=banana", cookie)
        await ws.connect()
        found, _ = await receive_events(ws, run.last_seq)
        await ws.disconnect()
        return found

    assert [seq for seq, _ in run_async(go())] == list(range(1, run.last_seq + 1))


def test_another_users_run_is_refused_with_4404(other_user, run):
    cookie = session_cookie(other_user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after=0", cookie)
        connected, _ = await ws.connect()
        assert connected  # accepted so the page can read the reason, then closed
        closed = await ws.receive_output(timeout=3)
        missing = socket("/ws/runs/999999/", cookie)
        await missing.connect()
        closed_missing = await missing.receive_output(timeout=3)
        return closed, closed_missing

    closed, closed_missing = run_async(go())
    assert closed == {"type": "websocket.close", "code": 4404}
    assert closed_missing == {"type": "websocket.close", "code": 4404}


def test_a_signed_out_visitor_is_refused_with_4403(run):
    async def go():
        ws = socket(f"/ws/runs/{run.pk}/")
        await ws.connect()
        run_closed = await ws.receive_output(timeout=3)
        fleet = socket("/ws/fleet/")
        await fleet.connect()
        return run_closed, await fleet.receive_output(timeout=3)

    run_closed, fleet_closed = run_async(go())
    assert run_closed == {"type": "websocket.close", "code": 4403}
    assert fleet_closed == {"type": "websocket.close", "code": 4403}


@pytest.mark.parametrize(
    "origin",
    [(b"origin", b"http://evil.example"), (b"origin", b"http://testserver.evil.example"), None],
    ids=["foreign", "lookalike", "missing"],
)
def test_a_foreign_origin_is_refused_before_the_consumer(user, run, origin):
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/", cookie, origin=origin)
        connected, _ = await ws.connect()
        return connected

    # Refused at the handshake (daphne answers it with HTTP 403): the consumer never runs.
    assert run_async(go()) is False


def test_signing_out_closes_an_open_socket(user, run, settings):
    settings.TETHER_WS_AUTH_RECHECK_SECONDS = 0.2
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def go():
        from tether.asgi import application

        ws = WebsocketCommunicator(
            application, f"/ws/runs/{run.pk}/?after={run.last_seq}", headers=[HOST, ORIGIN, (b"cookie", cookie)]
        )
        connected, _ = await ws.connect()
        assert connected
        await database_sync_to_async(client.post)("/logout/")
        while True:
            message = await ws.receive_output(timeout=3)
            if message["type"] == "websocket.close":
                return message

    assert run_async(go()) == {"type": "websocket.close", "code": 4403}


def test_fleet_socket_sends_the_live_blocks_and_again_on_change(user, instance, start_run):
    cookie = session_cookie(user)

    async def go():
        ws = socket("/ws/fleet/", cookie)
        connected, _ = await ws.connect()
        assert connected
        first = await ws.receive_from(timeout=3)
        assert await ws.receive_nothing(timeout=0.6)
        run = await database_sync_to_async(start_run)(instance, objective="a fresh objective")
        second = await ws.receive_from(timeout=3)
        await ws.disconnect()
        return first, second, run

    first, second, run = run_async(go())
    for block in ("fleet-needs", "fleet-active", "fleet-instances"):
        assert f'<section id="{block}"' in first and f'id="{block}"' in second
    assert first.count('hx-swap-oob="true"') == 3
    assert "a fresh objective" not in first
    assert "a fresh objective" in second and f"/runs/{run.pk}/" in second


def test_with_redis_a_doorbell_wakes_the_socket_at_once(user, run, settings):
    if not settings.REDIS_URL:
        pytest.skip("the doorbell rings only with REDIS_URL (the embedded default tails the table)")
    settings.TETHER_CONSOLE_POLL_SECONDS = 30  # only the doorbell can deliver within the timeout
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", cookie)
        await ws.connect()
        await asyncio.sleep(0.3)  # the socket has joined its group and is waiting
        await database_sync_to_async(record)(run, [("run.stop_requested", {"by": "ada"})])
        found, _ = await receive_events(ws, 1, timeout=2)
        await ws.disconnect()
        return found

    assert [seq for seq, _ in run_async(go())] == [run.last_seq + 1]
