"""Builders for console tests: a signed-in client and runs with a recorded story."""

import pytest
from django.db import transaction


@pytest.fixture
def signed_in(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def instance(user, make_instance):
    return make_instance(user, name="scribe", objective_max_chars=200)


@pytest.fixture
def start_run():
    from loops import services

    def build(instance, objective="write the report", **kw):
        return services.run_start(instance=instance, user=instance.owner, objective=objective, **kw)

    return build


ONE_ITERATION = [
    ("run.claimed", {"iteration": 1, "worker": "w1", "attempt": 1}),
    ("iteration.started", {"iteration": 1, "instruction": "write the report", "interjections": 0}),
    ("act.started", {"iteration": 1}),
    (
        "act.finished",
        {
            "iteration": 1,
            "ok": True,
            "detail": "",
            "response": "wrote report.md <script>alert(1)</script>",
            "tool_calls": [
                {"name": "write_file", "input": {"path": "report.md"}, "is_error": False, "result": "ok"}
            ],
            "usage": {"input_tokens": 120, "output_tokens": 30},
        },
    ),
    (
        "checks.finished",
        {
            "iteration": 1,
            "checks": [
                {"name": "tests", "required": True, "passed": False, "output": "1 failed"},
                {"name": "lint", "required": False, "passed": True, "output": ""},
            ],
        },
    ),
    ("decision.made", {"iteration": 1, "verdict": "continue", "reason": "a test still fails"}),
    ("iteration.finished", {"iteration": 1, "cost_usd": "0.001200", "duration_ms": 1530, "act_ok": True}),
]


def record(run, items):
    """Append events to `run` as the runner would (one transaction); return the last seq."""
    from loops import events

    with transaction.atomic():
        return events.append_many(run.pk, items)


@pytest.fixture
def story():
    return lambda run, items=ONE_ITERATION: record(run, items)


@pytest.fixture
def run(instance, start_run):
    """A run with one iteration recorded, as the console shows it."""
    run = start_run(instance)
    record(run, ONE_ITERATION)
    run.refresh_from_db()
    return run
