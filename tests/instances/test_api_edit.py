"""Changing and archiving an instance through the REST API: PATCH and DELETE /v1/instances/{id}.

Both go through instances.services, the path the console's edit and archive take, so the same
bounds, capabilities and ownership rules refuse here; a refusal saves nothing.
"""

import json

import pytest
from django.contrib.auth.models import Permission

from audit.models import AuditEntry
from instances.models import AgentTemplate, Credential, Instance
from loops.models import Run
from web.auth import make_token

pytestmark = pytest.mark.django_db

SECRET = "sk-ant-api03-" + "e" * 40 + "EDIT"


def _caller(client, user):
    token = make_token(user)

    def call(method, path, body=None):
        return getattr(client, method)(
            path,
            data=json.dumps(body) if body is not None else None,
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )

    return call


@pytest.fixture
def api(client, user):
    return _caller(client, user)


@pytest.fixture
def capable(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    return user


@pytest.fixture
def coder(api):
    """An instance of `user` made from the coder template through the API (no capability needed)."""
    made = api("post", "/v1/instances", {"name": "my-coder", "template": "coder", "max_iterations": 5})
    assert made.status_code == 201, made.content
    return Instance.objects.get(pk=made.json()["id"])


def _settings(instance):
    instance.refresh_from_db()
    return {f: getattr(instance, f) for f in (*Instance.setting_fields(), "name", "archived_at")}


def test_patch_changes_only_the_fields_given(api, coder):
    before = _settings(coder)
    response = api("patch", f"/v1/instances/{coder.pk}", {"name": "renamed", "max_iterations": 9, "model": None})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["name"], body["max_iterations"], body["template"]) == (coder.pk, "renamed", 9, "coder")
    after = _settings(coder)
    assert {k for k in after if after[k] != before[k]} == {"name", "max_iterations"}  # null: left as it is
    entry = AuditEntry.objects.get(action="instance.update")
    assert entry.via == "api" and entry.detail["changed"] == ["max_iterations", "name"]
    assert api("patch", f"/v1/instances/{coder.pk}", {}).json() == api("get", f"/v1/instances/{coder.pk}").json()


def test_patch_sets_and_refuses_a_credential_by_id(api, coder, other_user):
    mine = Credential.create_for(coder.owner, label="mine", secret=SECRET)
    theirs = Credential.create_for(other_user, label="theirs", secret=SECRET)
    response = api("patch", f"/v1/instances/{coder.pk}", {"credential_id": mine.pk})
    assert response.status_code == 200 and "EDIT" in response.json()["key_source"]
    refused = api("patch", f"/v1/instances/{coder.pk}", {"credential_id": theirs.pk, "name": "x"})
    assert refused.status_code == 404 and "not one of yours" in refused.json()["error"]
    coder.refresh_from_db()
    assert (coder.credential_id, coder.name) == (mine.pk, "my-coder")


@pytest.mark.parametrize(
    "body, field, message",
    [
        ({"colour": "blue"}, None, "unknown field(s): colour"),
        ({"template": "pilot"}, None, "unknown field(s): template"),  # an instance keeps its template
        ({"max_iterations": 0}, "max_iterations", "max_iterations must be between 1 and 10000"),
        ({"objective_max_chars": "many"}, "objective_max_chars", "objective_max_chars"),
        ({"name": "  "}, "name", "name"),
        ({"tools": ["teleport"]}, "tools", "teleport"),
    ],
)
def test_patch_refuses_a_bad_field_with_json_and_saves_nothing(api, coder, body, field, message):
    before = _settings(coder)
    response = api("patch", f"/v1/instances/{coder.pk}", {**body, "max_tool_turns": 3})
    assert response.status_code == 400, response.content
    error = response.json()
    assert message in error["error"] and error.get("field") == field
    assert _settings(coder) == before


def test_patch_that_leaves_a_command_brain_without_its_command_is_refused(api, capable, make_instance):
    mine = make_instance(capable, command=["my-agent"])
    response = api("patch", f"/v1/instances/{mine.pk}", {"command": []})
    assert response.status_code == 400 and response.json()["error"].startswith("command must be")
    mine.refresh_from_db()
    assert mine.command == ["my-agent"]
    changed = api("patch", f"/v1/instances/{mine.pk}", {"command": ["my-agent", "--fast"], "env": {"MODE": "x"}})
    assert changed.status_code == 200 and changed.json()["command"] == ["my-agent", "--fast"]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"command": ["sh", "-c", "cat /etc/passwd"]}, "changing command needs the run_programs capability"),
        ({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, "changing env needs the run_programs capability"),
        ({"base_url": "https://models.example.com"}, "changing base_url needs the run_programs capability"),
        ({"checks": [{"name": "t", "command": ["true"]}]}, "changing checks needs the run_programs capability"),
        ({"network": True}, "changing network needs the run_programs capability"),
        ({"workspace": "/etc"}, "system directory"),
        ({"workspace": "/tmp/elsewhere"}, "needs the run_programs capability"),
    ],
)
def test_without_the_capability_a_patch_of_what_runs_is_refused(api, coder, body, message):
    before = _settings(coder)
    response = api("patch", f"/v1/instances/{coder.pk}", {"name": "sneaky", **body})
    assert response.status_code == 403, response.content
    assert message in response.json()["error"]
    assert _settings(coder) == before


def test_another_users_instance_is_404_to_patch_and_delete(client, coder, other_user):
    as_bob = _caller(client, other_user)
    before = _settings(coder)
    for method, body in [
        ("get", None),
        ("patch", {"name": "mine now"}),
        ("patch", {"max_iterations": 0}),  # a bad body too: the id is what is wrong
        ("patch", {"command": ["sh"]}),
        ("delete", None),
    ]:
        response = as_bob(method, f"/v1/instances/{coder.pk}", body)
        assert response.status_code == 404, (method, body, response.content)
        assert response.json()["error"] == f"instance {coder.pk} not found"
    assert _settings(coder) == before
    assert not AuditEntry.objects.filter(action__in=["instance.update", "instance.archive"]).exists()


def test_the_objective_cap_without_the_capability_is_bounded_by_the_templates(api, coder, user):
    template = AgentTemplate.objects.get(name="coder")
    assert template.objective_max_chars == 8000
    over = api("post", "/v1/instances", {"name": "long", "template": "coder", "objective_max_chars": 8001})
    assert over.status_code == 403 and over.json()["field"] == "objective_max_chars"
    assert "at most 8,000 (the coder template's cap)" in over.json()["error"]
    assert not Instance.objects.filter(name="long").exists()
    raised = api("patch", f"/v1/instances/{coder.pk}", {"objective_max_chars": 20_000})
    assert raised.status_code == 403 and "at most 8,000" in raised.json()["error"]
    lowered = api("patch", f"/v1/instances/{coder.pk}", {"objective_max_chars": 500})
    assert lowered.status_code == 200 and lowered.json()["objective_max_chars"] == 500
    AgentTemplate.objects.filter(pk=template.pk).update(objective_max_chars=30_000)  # the operator raises it
    assert api("patch", f"/v1/instances/{coder.pk}", {"objective_max_chars": 20_000}).status_code == 200
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    assert api("patch", f"/v1/instances/{coder.pk}", {"objective_max_chars": 100_000}).status_code == 200


def test_delete_archives_and_is_idempotent_and_the_archived_instance_starts_no_run(api, make_instance, capable):
    from loops import services

    instance = make_instance(capable)
    earlier = services.run_start(instance=instance, user=capable, objective="before")
    refused = api("delete", f"/v1/instances/{instance.pk}")
    assert refused.status_code == 409 and "not finished" in refused.json()["error"]
    Run.objects.filter(pk=earlier.pk).update(status=Run.Status.FINISHED, outcome=Run.Outcome.CANCELLED)

    archived = api("delete", f"/v1/instances/{instance.pk}")
    assert archived.status_code == 200, archived.content
    assert archived.json()["id"] == instance.pk and archived.json()["archived_at"]
    again = api("delete", f"/v1/instances/{instance.pk}")
    assert again.status_code == 200 and again.json()["archived_at"] == archived.json()["archived_at"]
    assert AuditEntry.objects.filter(action="instance.archive").count() == 1
    assert Run.objects.filter(pk=earlier.pk).exists()  # nothing is deleted: its runs stay
    assert api("get", f"/v1/instances/{instance.pk}/loop/{earlier.pk}").status_code == 200

    started = api("post", f"/v1/instances/{instance.pk}/loop", {"objective": "more"})
    assert started.status_code == 409 and "archived" in started.json()["error"]
    assert Run.objects.filter(instance=instance).count() == 1
    edited = api("patch", f"/v1/instances/{instance.pk}", {"name": "kept"})
    assert edited.status_code == 200 and edited.json()["archived_at"] == archived.json()["archived_at"]


def test_patch_and_delete_are_in_the_openapi_document(api):
    spec = api("get", "/v1/openapi.json").json()
    route = spec["paths"]["/v1/instances/{instance_id}"]
    assert set(route) >= {"get", "patch", "delete"}
    for method in ("patch", "delete"):
        assert {"200", "400", "403", "404", "409"} <= set(route[method]["responses"])
    body = route["patch"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    change = spec["components"]["schemas"][body]
    assert "required" not in change and "template" not in change["properties"]
    assert set(change["properties"]) == set(spec["components"]["schemas"]["InstanceIn"]["properties"]) - {"template"}
