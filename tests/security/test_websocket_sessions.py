"""Console sockets: the Origin must be this site's (scheme, host and port), and a socket
closes within TETHER_WS_AUTH_RECHECK_SECONDS of its sign-in ending."""

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from tether.origin import origin_allowed

RECHECK = 0.5


def cookie_for(user) -> tuple[Client, bytes]:
    client = Client()
    client.force_login(user)
    return client, f"sessionid={client.cookies['sessionid'].value}".encode()


def communicator(path, *, host=b"127.0.0.1:8000", origin=b"http://127.0.0.1:8000", cookie=None):
    from tether.asgi import application

    headers = [(b"host", host)] if host else []
    if origin:
        headers.append((b"origin", origin))
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.mark.parametrize(
    ("origin", "host", "secure", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", False, True),
        ("http://127.0.0.1:1", "127.0.0.1:8000", False, False),  # same host, another port
        ("http://127.0.0.1", "127.0.0.1:8000", False, False),
        ("https://127.0.0.1:8000", "127.0.0.1:8000", False, False),  # another scheme
        ("http://localhost:8000", "127.0.0.1:8000", False, False),  # another (allowed) host
        ("https://tether.localhost", "tether.localhost", True, True),
        ("https://tether.localhost:443", "tether.localhost", True, True),
        ("http://tether.localhost", "tether.localhost", True, False),  # a plain-http page on a TLS site
        ("http://evil.example", "evil.example", False, False),  # Host not allowed (DNS rebinding)
        ("null", "127.0.0.1:8000", False, False),
        ("http://127.0.0.1:8000/page", "127.0.0.1:8000", False, False),
        ("http://127.0.0.1:99999", "127.0.0.1:8000", False, False),
        ("", "127.0.0.1:8000", False, False),
        ("http://127.0.0.1:8000", "", False, False),
    ],
)
def test_the_origin_must_match_scheme_host_and_port(settings, origin, host, secure, allowed):
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", ".localhost"]
    assert origin_allowed(origin, host, secure) is allowed


def test_a_csrf_trusted_origin_is_allowed_exactly(settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://tether.example"]
    assert origin_allowed("https://tether.example", "127.0.0.1:8000", False)
    assert not origin_allowed("https://tether.example:8443", "127.0.0.1:8000", False)
    assert not origin_allowed("http://tether.example", "127.0.0.1:8000", False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "opened"), [(b"http://127.0.0.1:1", False), (b"http://127.0.0.1:8000", True)], ids=["other-port", "same"]
)
def test_a_socket_from_another_port_is_refused_at_the_handshake(user, origin, opened):
    _, cookie = cookie_for(user)

    async def go():
        ws = communicator("/ws/fleet/", origin=origin, cookie=cookie)
        connected, _ = await ws.connect(timeout=5)
        if connected:
            first = await ws.receive_output(timeout=5)
            await ws.disconnect()
            return connected, first["type"]
        return connected, None

    connected, first = asyncio.run(go())
    assert connected is opened
    if opened:
        assert first == "websocket.send"  # the fleet's live blocks: it streams


def close_after(user, change, settings) -> tuple[dict, float]:
    """Open a fleet socket as `user`, apply `change(client, user)`, return the close and its delay."""
    settings.TETHER_WS_AUTH_RECHECK_SECONDS = RECHECK
    client, cookie = cookie_for(user)

    async def go():
        ws = communicator("/ws/fleet/", cookie=cookie)
        connected, _ = await ws.connect(timeout=5)
        assert connected
        assert (await ws.receive_output(timeout=5))["type"] == "websocket.send"
        await database_sync_to_async(change)(client, user)
        started = time.monotonic()
        while True:
            message = await ws.receive_output(timeout=RECHECK * 6)
            if message["type"] == "websocket.close":
                return message, time.monotonic() - started

    return asyncio.run(go())


@pytest.mark.django_db(transaction=True)
def test_deactivating_the_user_closes_their_socket(user, settings):
    def deactivate(client, user):
        user.is_active = False
        user.save(update_fields=["is_active"])

    closed, after = close_after(user, deactivate, settings)
    assert closed == {"type": "websocket.close", "code": 4403}
    assert after < RECHECK + 3.0  # "within seconds", with room for a loaded machine


@pytest.mark.django_db(transaction=True)
def test_changing_the_password_closes_the_other_sessions_sockets(user, settings):
    def change_password(client, user):
        user.set_password("a-new-password-42")
        user.save()

    closed, after = close_after(user, change_password, settings)
    assert closed == {"type": "websocket.close", "code": 4403}
    assert after < RECHECK + 3.0  # "within seconds", with room for a loaded machine


@pytest.mark.django_db(transaction=True)
def test_signing_out_closes_the_socket(user, settings):
    closed, after = close_after(user, lambda client, user: client.post("/logout/"), settings)
    assert closed == {"type": "websocket.close", "code": 4403}
    assert after < RECHECK + 3.0  # "within seconds", with room for a loaded machine


@pytest.mark.django_db(transaction=True)
def test_a_signed_in_socket_stays_open_across_rechecks(user, settings):
    settings.TETHER_WS_AUTH_RECHECK_SECONDS = 0.2
    _, cookie = cookie_for(user)

    async def go():
        ws = communicator("/ws/fleet/", cookie=cookie)
        connected, _ = await ws.connect(timeout=5)
        await ws.receive_output(timeout=5)
        quiet = await ws.receive_nothing(timeout=1.5)
        await ws.disconnect()
        return connected, quiet

    assert asyncio.run(go()) == (True, True)


def test_the_recheck_default_is_seconds_not_minutes():
    from django.conf import settings

    assert 0 < settings.TETHER_WS_AUTH_RECHECK_SECONDS <= 5
