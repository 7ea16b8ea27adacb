"""The `llm` decider: Claude's structured verdict, read by loops.decision.parse."""

import json

import pytest

from instances.brains.anthropic.decider import decide
from instances.brains.base import CredentialError, ProviderError
from loops.compaction import compact_history
from loops.decision import parse
from tests.fakes.messages_server import Error, text, tool_use

pytestmark = pytest.mark.django_db

SNAPSHOT = {
    "objective": "make the tests pass",
    "iteration": 3,
    "max_iterations": 10,
    "instruction": "fix test_parser",
    "response": "I fixed the off-by-one in parser.py and ran the tests.",
    "act_ok": True,
    "act_detail": "",
    "checks": [{"name": "tests", "passed": True, "required": True, "output": "12 passed"}],
    "history": compact_history(  # as the loop hands it over (`loops.compaction.for_prompt`)
        [
            {"iteration": 1, "instruction": "start", "response": "read the code", "checks": {"tests": False}, "verdict": "continue"},
            {"iteration": 2, "instruction": "fix it", "response": "tried", "checks": {"tests": False}, "verdict": "continue"},
        ],
        budget_tokens=2000,
        recent=3,
    ),
}


def test_decide_returns_the_structured_answer_for_the_parser(agent, server):
    verdict = {"verdict": "done", "reason": "all 12 tests pass", "next_instruction": ""}
    server.enqueue(
        tool_use("record_decision", verdict, say="The checks pass.",
                 usage={"input_tokens": 700, "output_tokens": 60, "cache_read_input_tokens": 400})
    )
    answer, usage = decide(agent(), SNAPSHOT)
    assert json.loads(answer) == verdict
    assert parse(answer).verdict == "done"
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.calls) == (700, 60, 400, 1)
    body = server.bodies[0]
    assert body["tool_choice"] == {"type": "auto"}  # asked for, never forced
    assert [t["name"] for t in body["tools"]] == ["record_decision"]
    prompt = body["messages"][0]["content"]
    assert "make the tests pass" in prompt and "fix test_parser" in prompt and "tests: passed" in prompt
    assert "iteration 3 of at most 10" in prompt and "Iteration 1:" in prompt


def test_a_prose_answer_is_returned_raw_and_still_parses(agent, server):
    server.enqueue(text('Not finished yet. {"verdict": "continue", "reason": "one test fails", '
                        '"next_instruction": "fix test_lexer"}'))
    answer, _ = decide(agent(), SNAPSHOT)
    decision = parse(answer)
    assert decision.verdict == "continue" and decision.next_instruction == "fix test_lexer"


def test_decider_credential_errors_are_not_retried(agent, server):
    server.enqueue(Error(401, "invalid x-api-key"))
    with pytest.raises(CredentialError):
        decide(agent(), SNAPSHOT)
    assert server.calls == 1


def test_decider_transient_errors_retry_then_give_up(agent, server):
    server.responder = lambda body: Error(529, "Overloaded", "overloaded_error")
    with pytest.raises(ProviderError) as caught:
        decide(agent(), SNAPSHOT)
    assert server.calls == 4 and caught.value.usage.calls == 4


def test_decider_tolerates_a_minimal_snapshot(agent, server):
    server.enqueue(tool_use("record_decision", {"verdict": "escalate", "reason": "unclear objective"}))
    answer, _ = decide(agent(), {"objective": "do something"})
    assert parse(answer).verdict == "escalate"
    assert "No machine checks" in server.bodies[0]["messages"][0]["content"]
