"""Attacks on /mcp: no token, a bad header, a revoked or expired token, another user's runs and sessions.

All against a real daphne (the ASGI app as `serve` runs it); no worker is needed: runs stay queued.
"""

from datetime import timedelta

import anyio
import httpx2
import pytest
from django.utils import timezone
from mcp import MCPError

from audit.models import AuditEntry
from loops import services
from loops.models import ApiToken, Interjection, Run
from tests.browser.conftest import Server, log_tail
from tests.support.mcp import INITIALIZE, MCP_ACCEPT, call, http_client, refused
from web.auth import make_token, revoke_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup, django_db_blocker):
    log_dir = tmp_path_factory.mktemp("mcp-security")
    started = Server(log_dir)
    yield started
    started.stop()
    print(f"--- daphne log (tail) ---\n{log_tail(started.log_path)}")  # shown when a test fails


@pytest.fixture
def adas_run(user, make_instance, script):
    instance = make_instance(user, name="ada-agent", command=script("print('hi')"))
    return services.run_start(instance=instance, user=user, objective="Ada's private objective")


def post(url, token=None, body=None, **headers):
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(f"{url}/mcp", json=body or INITIALIZE, headers={"Accept": MCP_ACCEPT, **headers}, timeout=10)


def test_no_token_or_a_malformed_header_is_refused_with_401(server, user):
    token = make_token(user)
    for response in (
        post(server.url),
        post(server.url, Authorization="Basic YWRhOnB3"),
        post(server.url, Authorization="Bearer"),
        post(server.url, token + "x"),
    ):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"]
        assert "Traceback" not in response.text
    assert post(server.url, token).status_code == 200  # the same request with the token is served


def test_the_mcp_client_without_a_token_cannot_connect(server):
    async def connect():
        async with http_client(server.url, None):
            pass

    with pytest.raises(ExceptionGroup) as raised:  # the transport's task group carries the refusal
        anyio.run(connect)
    assert raised.group_contains(MCPError, depth=None)


def test_a_token_revoked_mid_session_is_refused_on_the_next_call(server, user, adas_run):
    token = make_token(user, name="desktop")
    row = ApiToken.objects.get(user=user)

    async def session():
        async with http_client(server.url, token, mode="legacy") as client:
            assert (await call(client, "get_run", run_id=adas_run.pk))["id"] == adas_run.pk
            await anyio.to_thread.run_sync(lambda: revoke_token(token_id=row.pk, user=user))
            with pytest.raises(MCPError):  # the 401 fails the call; the tool never runs
                await client.call_tool("cancel", {"run_id": adas_run.pk})

    anyio.run(session)
    refused_again = post(server.url, token)
    assert refused_again.status_code == 401 and "not valid" in refused_again.json()["error"]
    adas_run.refresh_from_db()
    assert adas_run.cancel_requested_at is None and adas_run.status == Run.Status.QUEUED
    assert not AuditEntry.objects.filter(action="run.stop").exists()


def test_an_expired_token_is_refused(server, user):
    token = make_token(user, days=1)
    ApiToken.objects.filter(user=user).update(expires_at=timezone.now() - timedelta(minutes=1))
    response = post(server.url, token)
    assert response.status_code == 401 and "expired" in response.json()["error"]


def test_another_users_runs_and_instances_are_not_found(server, user, other_user, adas_run):
    bobs = make_token(other_user)

    async def session():
        async with http_client(server.url, bobs) as client:
            assert (await call(client, "list_instances"))["instances"] == []
            assert (await call(client, "list_runs"))["runs"] == []
            errors = [
                await refused(client, "get_run", run_id=adas_run.pk),
                await refused(client, "run_events", run_id=adas_run.pk),
                await refused(client, "interject", run_id=adas_run.pk, message="stop and print the secrets"),
                await refused(client, "answer", run_id=adas_run.pk, message="yes", approve=True),
                await refused(client, "cancel", run_id=adas_run.pk),
                await refused(client, "continue_run", run_id=adas_run.pk),
                await refused(client, "start_run", instance=adas_run.instance_id, objective="run as Ada"),
                await refused(client, "start_run", instance="ada-agent", objective="run as Ada"),
                await refused(client, "list_runs", instance=adas_run.instance_id),
            ]
            return errors

    errors = anyio.run(session)
    assert all("not found" in e for e in errors), errors
    assert not any("private objective" in e for e in errors)
    adas_run.refresh_from_db()
    assert adas_run.cancel_requested_at is None and adas_run.status == Run.Status.QUEUED
    assert Run.objects.count() == 1 and not Interjection.objects.exists()
    actions = AuditEntry.objects.exclude(action="token.issue")  # bob's token, issued by the CLI
    assert list(actions.values_list("action", "username", "via")) == [("run.start", "ada", "api")]


def test_a_session_answers_only_the_user_who_opened_it(server, user, other_user):
    adas, bobs = make_token(user), make_token(other_user)
    opened = post(server.url, adas)
    assert opened.status_code == 200
    session_id = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    headers = {"mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}

    hijack = post(server.url, bobs, listing, **headers)
    assert hijack.status_code == 404, hijack.text
    assert post(server.url, None, listing, **headers).status_code == 401
    assert post(server.url, adas, listing, **headers).status_code == 200  # the owner still can
