"""The REST surface: auth, ownership, the loop routes, and bad input."""

import json

import pytest

from loops.models import Event, Interjection, Run
from web.auth import make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client, user):
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="run_programs"))  # defines a command instance
    token = make_token(user)

    def call(method, path, body=None, raw=None, token=token):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        return getattr(client, method)(path, data=data, content_type="application/json", headers=headers)

    return call


@pytest.fixture
def instance(api):
    response = api("post", "/v1/instances", {"name": "fixer", "command": ["true"], "max_iterations": 3})
    assert response.status_code == 201, response.content
    return response.json()


def test_create_and_list_instances(api, instance):
    assert instance["brain"] == "command" and instance["decider"] == "checks"
    assert instance["objective_max_chars"] == 8000
    for key in ["id", "name", "command", "env", "workspace", "checks", "max_iterations"]:
        assert key in instance
    listed = api("get", "/v1/instances").json()["instances"]
    assert [i["id"] for i in listed] == [instance["id"]]


def test_start_get_list_events(api, instance):
    started = api("post", f"/v1/instances/{instance['id']}/loop", {"objective": "tidy up", "max_iterations": 2})
    assert started.status_code == 201
    run = started.json()
    for key in ["id", "status", "outcome", "outcome_detail", "verified", "iterations", "spent_usd"]:
        assert key in run
    assert run["status"] == "queued" and run["outcome"] is None
    got = api("get", f"/v1/instances/{instance['id']}/loop/{run['id']}").json()
    assert got["id"] == run["id"]
    assert [r["id"] for r in api("get", f"/v1/instances/{instance['id']}/loop").json()["runs"]] == [run["id"]]
    events = api("get", f"/v1/instances/{instance['id']}/loop/{run['id']}/events?after=0").json()
    assert events["events"][0]["kind"] == "run.started" and events["last_seq"] == 1
    assert api("get", f"/v1/instances/{instance['id']}/loop/{run['id']}/events?after=1").json() == {
        "events": [],
        "last_seq": 1,
        "more": False,
    }


def test_cancel_and_interject(api, instance, user):
    run = api("post", f"/v1/instances/{instance['id']}/loop", {"objective": "x"}).json()
    base = f"/v1/instances/{instance['id']}/loop/{run['id']}"
    queued = api("post", f"{base}/interject", {"message": "prefer small diffs"})
    assert queued.status_code == 202
    cancelled = api("post", f"{base}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["outcome"] == "cancelled"
    again = api("post", f"{base}/cancel")
    assert again.status_code == 409 and "already finished" in again.json()["error"]
    late = api("post", f"{base}/interject", {"message": "hello?"})
    assert late.status_code == 409 and "already finished" in late.json()["error"]
    assert Interjection.objects.count() == 1


def test_an_interjection_counts_a_crlf_as_one_character(api, instance):
    from tether.limits import MESSAGE_MAX_CHARS as INTERJECTION_MAX_CHARS

    run = api("post", f"/v1/instances/{instance['id']}/loop", {"objective": "x"}).json()
    base = f"/v1/instances/{instance['id']}/loop/{run['id']}"
    message = "ab\r\n" * (INTERJECTION_MAX_CHARS // 3)  # 3 characters a line, 4 counted as bytes
    assert api("post", f"{base}/interject", {"message": message}).status_code == 202
    assert Interjection.objects.get().text == message.replace("\r\n", "\n").strip()


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"objective": "x", "colour": "red"}), "unknown field(s): colour"),
        (json.dumps({"objective": 5}), "objective must be a string"),
        (json.dumps({"objective": "x", "max_iterations": "ten"}), "max_iterations must be a whole number"),
        (json.dumps({"objective": "x", "max_iterations": True}), "max_iterations must be a whole number"),
        (json.dumps({"objective": "x", "max_iterations": 0}), "from 1 to 10000"),
        (json.dumps({"objective": "x", "max_cost_usd": "lots"}), "max_cost_usd must be a number"),
        (json.dumps({"objective": "x", "max_cost_usd": -1}), "more than 0"),
        (json.dumps({}), "missing required field(s): objective"),
        (json.dumps({"objective": "y" * 9000}), "9,000 characters; this instance accepts at most 8,000"),
    ],
)
def test_start_refuses_bad_input(api, instance, raw, message):
    response = api("post", f"/v1/instances/{instance['id']}/loop", raw=raw)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    "body, message",
    [
        ({"name": "a", "command": "ruff check"}, "command must be a list"),
        ({"name": "a", "command": []}, "non-empty list of strings"),
        ({"name": "", "command": ["x"]}, "missing required field(s): name"),
        ({"name": "a", "command": ["x"], "brain": "gpt"}, "brain must be one of"),
        ({"name": "a", "command": ["x"], "checks": [{"name": "t"}]}, "checks[0].command"),
        ({"name": "a", "command": ["x"], "checks": [{"name": "t", "command": ["x"], "when": 1}]}, "unknown field(s): when"),
        ({"name": "a", "command": ["x"], "env": {"A": 1}}, "env must map"),
        ({"name": "a", "command": ["x"], "max_iterations": 0}, "between 1 and 10000"),
        ({"name": "a", "command": ["x"], "flavour": "x"}, "unknown field(s): flavour"),
    ],
)
def test_create_instance_refuses_bad_input(api, body, message):
    before = api("get", "/v1/instances").json()["instances"]
    response = api("post", "/v1/instances", body)
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert api("get", "/v1/instances").json()["instances"] == before


def test_auth_required_and_tokens_checked(api, instance):
    assert api("get", "/v1/instances", token=None).status_code == 401
    bad = api("get", "/v1/instances", token="nope")
    assert bad.status_code == 401 and "createtoken" in bad.json()["error"]


def test_another_users_objects_are_404(api, instance, other_user):
    run = api("post", f"/v1/instances/{instance['id']}/loop", {"objective": "x"}).json()
    token = make_token(other_user)
    base = f"/v1/instances/{instance['id']}"
    assert api("get", f"{base}/loop", token=token).status_code == 404
    assert api("post", f"{base}/loop", {"objective": "steal"}, token=token).status_code == 404
    assert api("get", f"{base}/loop/{run['id']}", token=token).status_code == 404
    assert api("post", f"{base}/loop/{run['id']}/cancel", token=token).status_code == 404
    assert api("post", f"{base}/loop/{run['id']}/interject", {"message": "hi"}, token=token).status_code == 404
    assert api("get", f"{base}/loop/{run['id']}/events", token=token).status_code == 404
    assert Run.objects.get().status == "queued" and Event.objects.count() == 1


def test_unknown_run_and_bad_after(api, instance):
    assert api("get", f"/v1/instances/{instance['id']}/loop/999").status_code == 404
    assert api("get", "/v1/instances/999/loop").status_code == 404
    run = api("post", f"/v1/instances/{instance['id']}/loop", {"objective": "x"}).json()
    bad = api("get", f"/v1/instances/{instance['id']}/loop/{run['id']}/events?after=-3")
    assert bad.status_code == 400 and "after must be" in bad.json()["error"]


def test_session_auth_needs_csrf(user, instance):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get("/v1/instances").status_code == 200
    refused = browser.post(f"/v1/instances/{instance['id']}/loop", data='{"objective": "x"}', content_type="application/json")
    assert refused.status_code == 403 and Run.objects.count() == 0


def test_openapi_document(client):
    spec = client.get("/v1/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert "/v1/instances/{instance_id}/loop/{run_id}/events" in spec["paths"]


def test_createtoken_command(django_user_model):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = io.StringIO()
    call_command("createtoken", "carol", "--create-user", stdout=out)
    token = out.getvalue().strip()
    from loops.models import ApiToken
    from web.auth import user_for_token

    assert user_for_token(token).username == "carol"
    assert not ApiToken.objects.filter(digest=token).exists()  # only the digest is stored
    with pytest.raises(CommandError, match="--create-user"):
        call_command("createtoken", "nobody")


def test_healthz(client):
    body = client.get("/healthz").json()
    assert body["database"] == "ok" and "workers" in body
