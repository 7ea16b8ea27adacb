"""Builders for brain tests: the local Messages API server and agents pointed at it."""

import threading

import pytest

from loops import compaction
from tests.fakes.messages_server import MessagesServer

KEY = "sk-ant-api03-TETHERTESTKEY-0123456789abcdefXYZW"


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch, settings):
    """No test sees the developer's own key or endpoint; retries are fast and few."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    settings.TETHER_ANTHROPIC_RETRIES = 3
    settings.TETHER_ANTHROPIC_BACKOFF_SECONDS = 0.001
    settings.TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS = 0.01
    settings.TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS = 10


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def agent(user, make_instance, server):
    """An anthropic-brain instance of `user` with its own stored key, talking to the local server."""
    from instances.models import Credential

    credential = Credential.create_for(user, label="mine", secret=KEY)

    def build(**fields):
        fields.setdefault("brain", "anthropic")
        fields.setdefault("decider", "llm")
        fields.setdefault("base_url", server.url)
        fields.setdefault("credential", credential)
        fields.setdefault("model", "claude-test-1")
        fields.setdefault("tools", ["list_files", "read_file", "write_file", "edit_file", "search_files", "run_command"])
        fields.setdefault("command", [])
        instance = make_instance(user, **fields)
        instance.workspace_path().mkdir(parents=True, exist_ok=True)
        return instance

    return build


@pytest.fixture
def act():
    """Run one act of `instance`; return the Reply."""
    from instances.brains.anthropic.act import AnthropicBrain
    from instances.brains.base import ActRequest

    # The act's own time limit is far above what a loaded machine needs: a test of the limit gives its own.
    def run(instance, instruction="do the work", *, snapshot=(), stop=None, timeout=600.0, iteration=1, **extra):
        request = ActRequest(
            run_id=1,
            iteration=iteration,
            objective="make the answer file",
            instruction=instruction,
            workspace=instance.workspace_path(),
            stop=stop or threading.Event(),
            timeout=timeout,
            snapshot=list(snapshot),
            history=compaction.for_prompt(snapshot),  # as the loop hands it over
        )
        for name, value in extra.items():
            setattr(request, name, value)
        return AnthropicBrain(instance).act(request)

    return run
