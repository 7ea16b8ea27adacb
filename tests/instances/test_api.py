"""Instances from templates, and write-only credentials, through the REST API."""

import json

import pytest

from web.auth import make_token

pytestmark = pytest.mark.django_db

SECRET = "sk-ant-api03-" + "q" * 40 + "WXYZ"


@pytest.fixture
def api(client, user):
    token = make_token(user)

    def call(method, path, body=None, token=token):
        return getattr(client, method)(
            path,
            data=json.dumps(body) if body is not None else None,
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )

    return call


def test_credentials_are_write_only(api):
    made = api("post", "/v1/credentials", {"label": "mine", "secret": SECRET})
    assert made.status_code == 201
    body = made.json()
    assert body["last4"] == "WXYZ" and SECRET not in made.content.decode()
    listed = api("get", "/v1/credentials")
    assert SECRET not in listed.content.decode() and listed.json()["credentials"][0]["label"] == "mine"
    assert api("delete", f"/v1/credentials/{body['id']}").status_code == 200
    assert api("delete", f"/v1/credentials/{body['id']}").status_code == 404


def test_instance_from_template_with_overrides(api):
    key = api("post", "/v1/credentials", {"label": "k", "secret": SECRET}).json()
    made = api(
        "post",
        "/v1/instances",
        {"name": "my-coder", "template": "coder", "credential_id": key["id"], "max_iterations": 7},
    )
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["template"] == "coder" and body["brain"] == "anthropic" and body["decider"] == "llm"
    assert body["max_iterations"] == 7 and "run_command" in body["tools"]
    assert "WXYZ" in body["key_source"] and SECRET not in made.content.decode()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"name": "a", "template": "nope"}, "unknown template 'nope'"),
        ({"name": "a", "template": "coder", "tools": ["teleport"]}, "unknown tool(s): teleport"),
        ({"name": "a", "template": "coder", "base_url": "ftp://x"}, "base_url must start with"),
        ({"name": "a", "template": "coder", "credential_id": 999}, "not one of yours"),
        ({"name": "a", "brain": "anthropic", "credential_id": 999}, "not one of yours"),
    ],
)
def test_bad_template_input(api, user, body, message):
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="run_programs"))  # input checks, not capabilities
    response = api("post", "/v1/instances", body)
    # A credential id that names nothing of yours is a 404, like an unknown id in a path.
    assert response.status_code == (404 if "credential_id" in body else 400), response.content
    assert message in response.json()["error"]
    assert api("get", "/v1/instances").json()["instances"] == []


def test_someone_elses_credential_cannot_be_used(api, other_user):
    from instances.models import Credential

    theirs = Credential.create_for(other_user, label="theirs", secret=SECRET)
    response = api("post", "/v1/instances", {"name": "a", "template": "coder", "credential_id": theirs.pk})
    assert response.status_code == 404  # an id that names nothing of yours, as in a path
    assert response.json()["field"] == "credential"


def test_starting_an_anthropic_instance_without_a_key_is_refused(api, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    inst = api("post", "/v1/instances", {"name": "a", "template": "triage"}).json()
    response = api("post", f"/v1/instances/{inst['id']}/loop", {"objective": "triage these"})
    assert response.status_code == 409 and "key" in response.json()["error"].lower()  # the instance is not ready


def test_loop_decide_runs_the_llm_decider_metered_to_the_callers_pool(api, agent, server, price):
    from budgets.models import LedgerEntry
    from loops.models import Event, Run
    from tests.fakes.messages_server import tool_use

    inst = agent()
    server.enqueue(tool_use("record_decision", {"verdict": "done", "reason": "tests pass", "next_instruction": ""}))
    response = api(
        "post",
        f"/v1/instances/{inst.pk}/loop-decide",
        {"objective": "make tests pass", "response": "fixed", "checks": [{"name": "tests", "passed": True}]},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["verdict"], body["reason"], body["decider"]) == ("done", "tests pass", "llm")
    assert body["usage"]["calls"] == 1
    assert server.calls == 1
    assert not Run.objects.exists() and not Event.objects.exists()
    # The call was metered and charged to the caller's own pool.
    from budgets.models import Pool, Reservation

    call = Reservation.objects.get()
    assert call.run_id is None and call.status == "settled" and call.actual > 0
    assert Pool.objects.get(kind="user", owner=inst.owner).spent == call.actual
    assert LedgerEntry.objects.filter(reservation=call).exists()


def test_loop_decide_is_refused_when_the_callers_pool_cannot_pay(api, agent, server, user, price):
    from budgets import limits
    from budgets.services import user_pool

    inst = agent()
    limits.set_limit(user_pool(user), 10, "admin")  # ten micro-dollars
    response = api("post", f"/v1/instances/{inst.pk}/loop-decide", {"objective": "make tests pass"})
    assert response.status_code == 402 and "budget_exhausted" in response.json()["error"]
    assert server.calls == 0


def test_loop_decide_with_the_checks_decider_and_bad_input(api, make_instance, user):
    inst = make_instance(user)
    base = f"/v1/instances/{inst.pk}/loop-decide"
    failing = api("post", base, {"objective": "x", "checks": [{"name": "lint", "passed": False, "output": "E1 bad"}]})
    assert failing.json()["verdict"] == "continue" and "E1 bad" in failing.json()["next_instruction"]
    assert api("post", base, {"objective": "x", "checks": [{"name": "lint", "passed": True}]}).json()["verdict"] == "done"
    bad = api("post", base, {"objective": "x", "checks": [{"name": "lint"}]})
    assert bad.status_code == 400 and "checks[0]" in bad.json()["error"]
    assert api("post", base, {"response": "no objective"}).status_code == 400


def test_loop_decide_shows_the_decider_the_given_history_compacted(api, agent, server, price, settings):
    from tests.fakes.messages_server import tool_use

    settings.TETHER_CONTEXT_RECENT = 1
    inst = agent()
    server.enqueue(tool_use("record_decision", {"verdict": "continue", "reason": "not yet", "next_instruction": "go on"}))
    history = [
        {"iteration": 1, "instruction": "read the code", "response": "read it", "verdict": "continue"},
        {"iteration": 2, "instruction": "fix the parser", "response": "fixed the off-by-one", "verdict": "continue"},
    ]
    response = api(
        "post", f"/v1/instances/{inst.pk}/loop-decide", {"objective": "make tests pass", "history": history}
    )
    assert response.status_code == 200, response.content
    prompt = server.bodies[-1]["messages"][0]["content"]
    # Compacted as a run's decider sees it: the latest iteration nearly whole, the one before a line.
    assert "History of this run (2 earlier iterations; recent ones in full):" in prompt
    assert "Iteration 2:" in prompt and "fixed the off-by-one" in prompt
    assert "- #1 continue; did: read the code" in prompt and "'instruction'" not in prompt
