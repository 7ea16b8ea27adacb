"""API tokens: named, listed without their secrets, expiring, revocable from the console and manage.py."""

import asyncio
import io
import re
from datetime import timedelta

import pytest
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from loops.models import ApiToken
from web.auth import make_token

pytestmark = pytest.mark.django_db

SECRET = re.compile(rb"tth_[A-Za-z0-9_-]{20,}")


def api_get(token, path="/v1/instances"):
    return Client().get(path, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def console(user):
    client = Client()
    client.force_login(user)
    return client


def test_the_console_makes_a_token_shows_it_once_and_lists_it_without_the_secret(console, user):
    assert b'href="/tokens/"' in console.get("/").content  # reachable from the nav
    made = console.post("/tokens/", {"name": "ci", "days": "30"}, follow=True)
    # POST, then 303 to the page that shows it: a reload of that page mints nothing.
    assert made.redirect_chain == [("/tokens/", 303)] and made["Cache-Control"] == "no-store"
    token = SECRET.search(made.content).group().decode()
    assert b"data-copy=" in made.content  # a Copy button beside the once-shown secret
    assert api_get(token).status_code == 200

    listed = console.get("/tokens/")
    assert listed.status_code == 200
    assert not SECRET.search(listed.content)  # never the secret again
    row = ApiToken.objects.get(user=user)
    assert row.name == "ci" and row.digest != token and token.encode() not in listed.content
    assert row.last_used_at is not None and timedelta(days=29) < row.expires_at - timezone.now() <= timedelta(days=30)
    assert ApiToken.objects.filter(user=user).count() == 1  # the reload above made no second token
    assert b"ci" in listed.content and row.prefix.encode() in listed.content and b"last used" in listed.content


def test_revoking_in_the_console_refuses_the_very_next_request(console, user):
    token = make_token(user, name="laptop")
    assert api_get(token).status_code == 200
    row = ApiToken.objects.get(user=user)
    revoked = console.post(f"/tokens/{row.pk}/revoke")
    assert revoked.status_code == 302
    refused = api_get(token)
    assert refused.status_code == 401 and "not valid" in refused.json()["error"]
    assert f'id="token-{row.pk}"'.encode() not in console.get("/tokens/").content


def test_revoking_asks_first(console, user):
    make_token(user, name="laptop")
    page = console.get("/tokens/").content.decode()
    confirm = page[page.index('<details class="stop-confirm">') :]
    assert confirm.index("Revoke…") < confirm.index("Yes, revoke it") < confirm.index("</details>")


def test_another_user_cannot_revoke_or_see_my_token(user, other_user):
    token = make_token(user, name="mine")
    row = ApiToken.objects.get(user=user)
    bob = Client()
    bob.force_login(other_user)
    assert bob.post(f"/tokens/{row.pk}/revoke").status_code == 404
    assert b"mine" not in bob.get("/tokens/").content
    assert api_get(token).status_code == 200  # still works


def test_revoking_needs_a_post_and_a_signed_in_user(console, user):
    make_token(user)
    row = ApiToken.objects.get(user=user)
    assert console.get(f"/tokens/{row.pk}/revoke").status_code == 405
    assert Client().post(f"/tokens/{row.pk}/revoke").status_code == 302  # to the sign-in page
    assert ApiToken.objects.filter(pk=row.pk).exists()


def test_bad_token_forms_are_refused_with_a_message(console, user):
    unnamed = console.post("/tokens/", {"name": "", "days": ""})
    assert unnamed.status_code == 400 and b"Name the token" in unnamed.content
    too_long = console.post("/tokens/", {"name": "x" * 101, "days": "7"})
    assert too_long.status_code == 400 and b"at most 100" in too_long.content
    forever = console.post("/tokens/", {"name": "ci", "days": "99999999999"})
    assert forever.status_code == 400 and b"Choose one of the listed lifetimes" in forever.content
    assert not ApiToken.objects.exists()


def test_an_expired_token_answers_401_json(user):
    token = make_token(user, name="short", days=1)
    assert api_get(token).status_code == 200
    ApiToken.objects.filter(user=user).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = api_get(token)
    assert refused.status_code == 401 and refused["Content-Type"] == "application/json"
    assert "expired" in refused.json()["error"] and token not in refused.json()["error"]


def test_the_token_command_creates_lists_and_revokes(user):
    out = io.StringIO()
    call_command("token", "create", "ada", "--name", "deploy", "--days", "7", stdout=out)
    token = out.getvalue().strip()
    assert api_get(token).status_code == 200

    listing = io.StringIO()
    call_command("token", "list", stdout=listing)
    row = ApiToken.objects.get(user=user)
    assert "deploy" in listing.getvalue() and row.prefix in listing.getvalue()
    assert token not in listing.getvalue() and not SECRET.search(listing.getvalue().encode())

    call_command("token", "revoke", str(row.pk), stdout=io.StringIO())
    assert api_get(token).status_code == 401
    with pytest.raises(CommandError, match="no API token with id"):
        call_command("token", "revoke", str(row.pk))
    with pytest.raises(CommandError, match="1 to 3650 days"):
        call_command("token", "create", "ada", "--days", "100000")
    with pytest.raises(CommandError, match="no user named"):
        call_command("token", "list", "nobody")


@pytest.mark.django_db(transaction=True)
def test_console_sockets_take_the_session_never_a_token(user, run_for_socket):
    """A socket cannot be opened with a token, so none outlives a revoked one."""
    from tether.asgi import application

    token = make_token(user)

    async def go():
        ws = WebsocketCommunicator(
            application,
            f"/ws/runs/{run_for_socket.pk}/",
            headers=[(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"authorization", f"Bearer {token}".encode())],
        )
        connected, _ = await ws.connect()
        closed = await ws.receive_output(timeout=5)
        await ws.disconnect()
        return connected, closed

    connected, closed = asyncio.run(go())
    assert connected and closed == {"type": "websocket.close", "code": 4403}


@pytest.fixture
def run_for_socket(user, make_instance):
    from loops import services

    return services.run_start(instance=make_instance(user), user=user, objective="write the report")
