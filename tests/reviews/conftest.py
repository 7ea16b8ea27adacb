"""Builders for review tests: scripted agents, the local Messages server as decider and judge."""


import pytest

from tests.fakes.messages_server import MessagesServer, tool_use
from tests.loops.conftest import drive, drive_in_thread, start  # noqa: F401 (fixtures)

KEY = "sk-ant-api03-TETHERREVIEWKEY-0123456789abcdefQRST"
MODEL = "claude-test-1"


@pytest.fixture(autouse=True)
def review_settings(settings, monkeypatch, tmp_path):
    """No ambient keys; fast retries and backoff; a fixed sampling seed; snapshots under tmp."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings.TETHER_ANTHROPIC_RETRIES = 1
    settings.TETHER_ANTHROPIC_BACKOFF_SECONDS = 0.001
    settings.TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS = 0.01
    settings.TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS = 10
    settings.TETHER_NOTIFY_BACKOFF_SECONDS = 0.01
    settings.TETHER_NOTIFY_BACKOFF_MAX_SECONDS = 0.05
    settings.TETHER_NOTIFY_TIMEOUT_SECONDS = 5
    settings.TETHER_WEBHOOK_ALLOW_PRIVATE = True  # the test receivers listen on 127.0.0.1
    settings.TETHER_REVIEW_SAMPLE_SEED = "tests"
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def credential(user):
    from instances.models import Credential

    return Credential.create_for(user, label="mine", secret=KEY)


def is_judge_call(body):
    return any(tool.get("name") == "record_grade" for tool in body.get("tools") or [])


def decision(verdict="done", reason="the work is complete"):
    return tool_use("record_decision", {"verdict": verdict, "reason": reason})


def grade_reply(verdict, *reasons):
    return tool_use("record_grade", {"verdict": verdict, "reasons": list(reasons)})


@pytest.fixture
def claude(server):
    """Script the local server as both the llm decider (always done) and the judge (`judge` verdict)."""

    class Claude:
        def __init__(self):
            self.judge = ("pass", ["the objective is met"])
            self.decider = ("done", "the work is complete")
            self.judged = self.decided = 0

        def __call__(self, body):
            if is_judge_call(body):
                self.judged += 1
                return grade_reply(self.judge[0], *self.judge[1])
            self.decided += 1
            return decision(*self.decider)

    scripted = Claude()
    server.responder = scripted
    return scripted


def judge_prompts(server):
    return [r.body for r in server.requests if isinstance(r.body, dict) and is_judge_call(r.body)]

