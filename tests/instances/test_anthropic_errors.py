"""Provider errors through the real SDK: credential errors never retry, transient ones retry within bounds."""

import time

import pytest

from instances.brains.base import CredentialError, ProviderError
from tests.fakes.messages_server import CREDIT_TOO_LOW, Delay, Drop, Error, text, tool_use
from tests.instances.conftest import KEY

pytestmark = pytest.mark.django_db

RETRIES = 3  # conftest sets TETHER_ANTHROPIC_RETRIES


@pytest.mark.parametrize(
    ("status", "message", "error_type", "says"),
    [
        (401, "invalid x-api-key", "", "rejected the API key"),
        (403, "Your API key does not have permission to use the specified resource.", "", "not allowed"),
        (400, CREDIT_TOO_LOW, "invalid_request_error", "billing"),
        (402, "Payment required", "", "billing"),
        (400, "Your organization has reached its spend limit.", "billing_error", "billing"),
    ],
)
def test_credential_errors_are_not_retried(agent, act, server, status, message, error_type, says):
    server.enqueue(Error(status, message, error_type), text("never reached"))
    with pytest.raises(CredentialError) as caught:
        act(agent())
    assert server.calls == 1  # zero retries
    assert says in caught.value.detail
    assert caught.value.outcome == "credential_error"
    assert caught.value.usage.calls == 1


def test_a_wrong_key_is_refused_by_the_server_and_not_retried(agent, act, server, user):
    from instances.models import Credential

    wrong = Credential.create_for(user, label="wrong", secret="sk-ant-wrong-key-0000")
    with pytest.raises(CredentialError, match="rejected the API key"):
        act(agent(credential=wrong))
    assert server.calls == 1


def test_a_missing_key_makes_no_call_and_says_how_to_add_one(agent, act, server):
    with pytest.raises(CredentialError) as caught:
        act(agent(credential=None))
    assert server.calls == 0
    assert "Credentials" in caught.value.detail and "ANTHROPIC_API_KEY" in caught.value.detail
    assert caught.value.usage.calls == 0


def test_the_environment_key_is_the_single_user_fallback(agent, act, server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)  # the operator's endpoint, not the instance's own
    server.enqueue(text("ok"))
    assert act(agent(credential=None, base_url="")).ok
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_the_environment_base_url_is_the_fallback_endpoint(agent, act, server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.enqueue(text("ok"))
    assert act(agent(base_url="")).ok
    assert server.calls == 1


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(429, "rate_limit_error"), (529, "overloaded_error"), (500, "api_error"), (503, "api_error")],
)
def test_transient_errors_retry_within_bounds_then_provider_error(agent, act, server, status, error_type):
    server.responder = lambda body: Error(status, "try later", error_type)
    with pytest.raises(ProviderError) as caught:
        act(agent())
    assert server.calls == RETRIES + 1
    assert caught.value.outcome == "provider_error"
    assert str(status) in caught.value.detail and f"{RETRIES + 1} attempt" in caught.value.detail
    assert caught.value.usage.calls == RETRIES + 1


def test_an_overload_then_success_works(agent, act, server):
    server.enqueue(Error(529, "Overloaded", "overloaded_error"), text("done"))
    reply = act(agent())
    assert reply.ok and reply.text == "done"
    assert server.calls == 2 and reply.usage.calls == 2


def test_a_dropped_connection_is_retried(agent, act, server):
    server.enqueue(Drop(), text("done"))
    reply = act(agent())
    assert reply.ok and server.calls == 2


def test_dropped_connections_past_the_bound_are_a_provider_error(agent, act, server):
    server.responder = lambda body: Drop()
    with pytest.raises(ProviderError, match="connection"):
        act(agent())
    assert server.calls == RETRIES + 1


def test_a_timed_out_call_is_retried(agent, act, server, settings):
    # The first answer comes after 60 s, the second at once: a timeout between them (2 s, well above a
    # loaded machine's round trip to the local server, which a 0.3 s timeout missed) cuts the first only.
    settings.TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS = 2.0
    server.enqueue(Delay(60, text("late")), text("done"))
    reply = act(agent())
    assert reply.ok and reply.text == "done"
    assert server.calls == 2


def test_the_retry_bound_is_per_act_not_per_call(agent, act, server):
    # Two failures before the first answer and two before the second: four retries in one act.
    server.enqueue(
        Error(529, "Overloaded"), Error(529, "Overloaded"), tool_use("list_files", {}),
        Error(500, "oops"), Error(500, "oops"), text("never"),
    )
    with pytest.raises(ProviderError):
        act(agent())
    assert server.calls == 5


def test_retry_after_is_honoured_within_the_backoff_cap(agent, act, server, settings):
    settings.TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS = 0.4
    server.enqueue(Error(429, "slow down", headers={"retry-after": "0.3"}), text("done"))
    began = time.monotonic()
    assert act(agent()).ok
    assert 0.3 <= time.monotonic() - began < 10  # waited what it was told, not a long backoff


def test_other_client_errors_are_not_retried(agent, act, server):
    server.enqueue(Error(400, "messages: text content blocks must be non-empty", "invalid_request_error"))
    with pytest.raises(ProviderError, match="refused the request"):
        act(agent())
    assert server.calls == 1


def test_usage_spent_before_a_failure_travels_on_the_error(agent, act, server):
    server.enqueue(
        tool_use("list_files", {}, usage={"input_tokens": 500, "output_tokens": 50,
                                          "cache_creation_input_tokens": 200, "cache_read_input_tokens": 100}),
        Error(401, "invalid x-api-key"),
    )
    with pytest.raises(CredentialError) as caught:
        act(agent())
    u = caught.value.usage
    assert (u.input_tokens, u.output_tokens, u.cache_write_tokens, u.cache_read_tokens, u.calls) == (500, 50, 200, 100, 2)


def test_an_error_echoing_the_key_does_not_leak_it(agent, act, server, caplog):
    caplog.set_level("DEBUG")
    server.enqueue(Error(401, f"invalid x-api-key: {KEY}"))
    with pytest.raises(CredentialError) as caught:
        act(agent())
    assert KEY not in str(caught.value) and KEY not in caught.value.detail
    assert "[redacted]" in caught.value.detail
    assert KEY not in caplog.text
