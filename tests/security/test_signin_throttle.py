"""Password sign-in is throttled per username and address (django-axes); one-time links still work."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.db.models import F
from django.test import Client

from web.accounts import login_link

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def throttle(settings):
    settings.TETHER_LOGIN_FAILURE_LIMIT = 5
    settings.TETHER_LOGIN_COOLOFF_SECONDS = 900


def sign_in(client, username, password, path="/login/"):
    return client.post(path, {"username": username, "password": password})


def signed_in(client) -> bool:
    return client.get("/").status_code == 200


def test_thirty_wrong_passwords_are_not_thirty_answers_of_the_form(client, user):
    codes = [sign_in(client, "ada", f"guess-{n}").status_code for n in range(30)]
    assert codes.count(200) == 4  # the fifth failure locks; the page says so
    assert codes[4:] == [429] * 26
    page = sign_in(client, "ada", "guess-31")
    assert page.status_code == 429
    assert b"Sign-in paused" in page.content and b"15 minutes" in page.content
    assert b"pw-ada-123" not in page.content


def age_attempts(seconds: float) -> None:
    """Let `seconds` pass for the throttle: move every recorded failed attempt back in time."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=seconds))


def test_the_right_password_is_refused_until_the_cool_off_passes(client, user):
    for n in range(5):
        sign_in(client, "ada", f"guess-{n}")
    refused = sign_in(client, "ada", "pw-ada-123")
    assert refused.status_code == 429 and not signed_in(client)
    age_attempts(890)  # still inside the 15 minutes
    assert sign_in(client, "ada", "pw-ada-123").status_code == 429 and not signed_in(client)
    age_attempts(901)
    accepted = sign_in(client, "ada", "pw-ada-123")
    assert accepted.status_code == 302 and signed_in(client)


def test_a_short_cool_off_setting_is_honoured(client, user, settings):
    settings.TETHER_LOGIN_COOLOFF_SECONDS = 60
    for n in range(6):
        sign_in(client, "ada", f"guess-{n}")
    assert b"60 seconds" in sign_in(client, "ada", "pw-ada-123").content
    age_attempts(61)
    assert sign_in(client, "ada", "pw-ada-123").status_code == 302


def test_another_user_and_another_address_are_not_locked_out(client, user, other_user):
    for n in range(6):
        sign_in(client, "ada", f"guess-{n}")
    assert sign_in(client, "ada", "pw-ada-123").status_code == 429

    bob = Client()  # same address, another account
    assert sign_in(bob, "bob", "pw-bob-123").status_code == 302 and signed_in(bob)
    elsewhere = Client(REMOTE_ADDR="10.0.0.2")  # same account, another address
    assert sign_in(elsewhere, "ada", "pw-ada-123").status_code == 302 and signed_in(elsewhere)


def test_the_admin_sign_in_is_throttled_too(client, django_user_model):
    django_user_model.objects.create_superuser("root", email="", password="pw-root-123")
    codes = [sign_in(client, "root", f"guess-{n}", "/admin/login/").status_code for n in range(8)]
    assert codes[:4] == [200] * 4 and set(codes[4:]) == {429}
    assert sign_in(client, "root", "pw-root-123", "/admin/login/").status_code == 429
    assert client.get("/admin/").status_code == 302  # not signed in


def test_a_one_time_link_still_signs_in_and_clears_the_lockout(client, user):
    for n in range(6):
        sign_in(client, "ada", f"guess-{n}")
    assert sign_in(client, "ada", "pw-ada-123").status_code == 429
    link = login_link(user, "http://testserver").removeprefix("http://testserver")
    assert client.get(link).status_code == 302 and signed_in(client)
    client.logout()
    assert sign_in(client, "ada", "pw-ada-123").status_code == 302 and signed_in(client)


@pytest.mark.django_db(transaction=True)
def test_the_lockout_holds_through_the_asgi_handler_daphne_serves(user):
    """Under ASGI the middleware runs its async path; the lockout page must come out of it too."""
    import asyncio

    from django.test import AsyncClient

    async def go():
        client = AsyncClient()
        codes = [
            (await client.post("/login/", {"username": "ada", "password": f"guess-{n}"})).status_code for n in range(6)
        ]
        right = await client.post("/login/", {"username": "ada", "password": "pw-ada-123"})
        return codes, right

    codes, right = asyncio.run(go())
    assert codes == [200] * 4 + [429, 429]
    assert right.status_code == 429 and b"Sign-in paused" in right.content
