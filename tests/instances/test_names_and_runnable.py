"""Names that identify and configurations that can run, refused the same way on every surface (issue #26, items 10, 11).

One owner decides (`instances.validation.check_saved`, `invisible`, `key_problem`): the REST API
answers a JSON 4xx, the console shows the form again with the message, the admin refuses and
saves nothing. A delegate call naming two instances refuses instead of picking one.
"""

import json

import pytest
from django.contrib.auth.models import Permission

from instances.models import Credential, Instance
from web.auth import make_token

pytestmark = pytest.mark.django_db

KEY = "sk-ant-api03-" + "n" * 40 + "NAME"
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE
ZWSP = "\u200b"  # ZERO WIDTH SPACE


@pytest.fixture(autouse=True)
def workspace_roots(settings, tmp_path):
    settings.TETHER_WORKSPACE_ROOTS = [str(tmp_path)]  # where an operator lets workspaces be named


@pytest.fixture
def capable(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    return user


@pytest.fixture
def api(client, capable):
    token = make_token(capable)

    def call(method, path, body=None):
        return getattr(client, method)(
            path, data=json.dumps(body) if body is not None else None, content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )

    return call


def admin_form(owner, **fields):
    data = {
        "owner": owner.pk, "name": "via-admin", "brain": "command", "decider": "checks", "max_iterations": 3,
        "workspace": "", "model": "", "system_prompt": "", "base_url": "", "tools": "[]", "command_allow": "[]",
        "command_deny": "[]", "approval_tools": "[]", "max_tool_turns": 20, "max_output_tokens": 16000,
        "tool_timeout_seconds": 120, "act_timeout_seconds": 600, "objective_max_chars": 8000,
        "command": '["true"]', "env": "{}", "checks": "[]", "protected_paths": "[]", "mcp_servers": "[]",
    }
    data.update(fields)
    return data


@pytest.fixture
def staff(django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123")
    return admin


# --- item 10: configurations that cannot run -------------------------------------------------


def test_api_refuses_a_program_brain_without_a_command_from_a_template(api):
    answer = api("post", "/v1/instances", {"name": "empty", "template": "coder", "brain": "command", "command": []})
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert "needs its command" in json.dumps(body)
    assert not Instance.objects.filter(name="empty").exists()


def test_api_refuses_a_script_missing_from_a_new_own_workspace(api):
    """The duplicate of `ask-first`: `sh agent.sh` in its own, new and empty workspace cannot open agent.sh."""
    answer = api("post", "/v1/instances", {"name": "ask-copy", "command": ["sh", "agent.sh"]})
    assert answer.status_code == 400, answer.content
    text = json.dumps(answer.json())
    assert "agent.sh" in text and "new and empty" in text and "absolute path" in text
    assert not Instance.objects.filter(name="ask-copy").exists()
    for argv in (["./agent.sh"], ["python3", "-u", "bin/main.py"]):
        refused = api("post", "/v1/instances", {"name": "rel", "command": argv})
        assert refused.status_code == 400 and "new and empty" in json.dumps(refused.json()), argv


def test_a_bare_script_name_is_refused_even_with_the_script_there(api, tmp_path):
    workspace = tmp_path / "has-it"
    workspace.mkdir()
    (workspace / "agent.sh").write_text("echo hi\n")
    answer = api("post", "/v1/instances", {"name": "bare", "command": ["agent.sh"], "workspace": str(workspace)})
    assert answer.status_code == 400, answer.content
    assert "./agent.sh" in json.dumps(answer.json())


def test_a_script_in_its_workspace_and_code_given_inline_are_accepted(api, tmp_path):
    workspace = tmp_path / "ask"
    workspace.mkdir()
    (workspace / "agent.sh").write_text("echo hi\n")
    made = api("post", "/v1/instances", {"name": "ask", "command": ["sh", "agent.sh"], "workspace": str(workspace)})
    assert made.status_code == 201, made.content
    inline = api("post", "/v1/instances", {"name": "inline", "command": ["sh", "-c", "echo hi > out.txt"]})
    assert inline.status_code == 201, inline.content
    absolute = api("post", "/v1/instances", {"name": "abs", "command": ["/usr/bin/true"]})
    assert absolute.status_code == 201, absolute.content


def test_api_edit_refuses_emptying_a_program_command(api, capable, tmp_path):
    made = api("post", "/v1/instances", {"name": "prog", "template": "program"}).json()
    answer = api("patch", f"/v1/instances/{made['id']}", {"command": []})
    assert answer.status_code == 400, answer.content
    assert "needs its command" in json.dumps(answer.json())
    assert Instance.objects.get(pk=made["id"]).command  # unchanged


def test_console_refuses_a_program_brain_with_an_empty_command(client, capable):
    client.force_login(capable)
    from instances.models import AgentTemplate

    coder = AgentTemplate.objects.get(name="coder")
    data = {
        "name": "no-command", "model": coder.model, "credential": "", "max_iterations": 3, "objective_max_chars": 8000,
        "max_tool_turns": 20, "max_output_tokens": 8000, "workspace": "", "brain": "command", "decider": "checks",
        "command": "", "checks": "", "env": "", "command_allow": "", "command_deny": "", "protected_paths": "",
        "tool_timeout_seconds": 120, "act_timeout_seconds": 600, "base_url": "", "system_prompt": "",
    }
    answer = client.post("/instances/new/coder/", data)
    assert answer.status_code == 400
    page = answer.content.decode()
    assert "needs its command" in page and 'data-error-summary' in page
    assert not Instance.objects.filter(name="no-command").exists()


def test_console_duplicate_of_ask_first_is_refused_with_what_to_fix(client, capable, tmp_path):
    workspace = tmp_path / "example-ask-first"
    workspace.mkdir()
    (workspace / "agent.sh").write_text("echo hi\n")
    source = Instance.objects.create(
        owner=capable, name="ask-first", brain="command", command=["sh", "agent.sh"], workspace=str(workspace),
        checks=[{"name": "greeting", "command": ["test", "-s", "greeting.txt"], "required": True}],
    )
    client.force_login(capable)
    form = client.get(f"/instances/{source.pk}/duplicate")
    assert form.status_code == 200
    data = {
        "name": "ask-first copy", "model": "", "credential": "", "max_iterations": 3, "objective_max_chars": 8000,
        "max_tool_turns": 20, "max_output_tokens": 16000, "workspace": "", "brain": "command", "decider": "checks",
        "command": "sh agent.sh", "checks": "greeting: test -s greeting.txt", "env": "", "command_allow": "",
        "command_deny": "", "protected_paths": "", "tool_timeout_seconds": 120, "act_timeout_seconds": 600,
        "base_url": "", "system_prompt": "",
    }
    answer = client.post(f"/instances/{source.pk}/duplicate", data)
    assert answer.status_code == 400
    page = answer.content.decode()
    assert "cannot open agent.sh" in page and 'aria-invalid="true"' in page
    assert Instance.objects.filter(owner=capable).count() == 1


def test_admin_refuses_a_script_missing_from_a_new_workspace_and_an_empty_command(client, staff):
    client.force_login(staff)
    answer = client.post("/admin/instances/instance/add/", admin_form(staff, command='["sh", "agent.sh"]'))
    assert answer.status_code == 400
    assert "cannot open agent.sh" in answer.content.decode()
    empty = client.post("/admin/instances/instance/add/", admin_form(staff, command="[]"))
    assert empty.status_code == 400 and "needs its command" in empty.content.decode()
    assert not Instance.objects.exists()


# --- item 11: names that identify ----------------------------------------------------------


def test_api_refuses_a_duplicate_name_of_the_same_owner(api, other_user):
    assert api("post", "/v1/instances", {"name": "kid", "command": ["true"]}).status_code == 201
    again = api("post", "/v1/instances", {"name": "kid", "command": ["true"]})
    assert again.status_code == 409, again.content
    assert "already have an instance named 'kid'" in again.json()["error"] and again.json()["field"] == "name"
    assert api("post", "/v1/instances", {"name": "KID", "command": ["true"]}).status_code == 409  # case apart only
    other = api("post", "/v1/instances", {"name": "kid2", "command": ["true"]}).json()
    renamed = api("patch", f"/v1/instances/{other['id']}", {"name": "kid"})
    assert renamed.status_code == 409 and Instance.objects.get(pk=other["id"]).name == "kid2"
    # Another owner may use the name.
    Instance.objects.create(owner=other_user, name="kid", command=["true"])


def test_console_and_admin_refuse_a_duplicate_name(client, capable, staff):
    Instance.objects.create(owner=capable, name="kid", command=["true"])
    client.force_login(capable)
    from instances.models import AgentTemplate

    triage = AgentTemplate.objects.get(name="triage")
    page = client.get("/instances/new/triage/").content.decode()
    data = {
        "name": "kid", "model": triage.model, "credential": "", "max_iterations": 3, "objective_max_chars": 8000,
        "max_tool_turns": 20, "max_output_tokens": 8000, "workspace": "", "brain": "anthropic", "decider": "llm",
        "command": "", "checks": "", "env": "", "command_allow": "", "command_deny": "", "protected_paths": "",
        "tool_timeout_seconds": 120, "act_timeout_seconds": 600, "base_url": "", "system_prompt": "", "tools": [],
    }
    assert 'value="triage"' in page
    answer = client.post("/instances/new/triage/", data)
    assert answer.status_code == 409
    assert "already have an instance named" in answer.content.decode()
    Instance.objects.create(owner=staff, name="taken", command=["true"])
    client.force_login(staff)
    refused = client.post("/admin/instances/instance/add/", admin_form(staff, name="taken"))
    assert refused.status_code == 400 and "already have an instance named" in refused.content.decode()
    assert Instance.objects.filter(owner=staff).count() == 1


def test_a_duplicate_gets_a_free_name(client, capable):
    source = Instance.objects.create(owner=capable, name="worker", command=["true"])
    Instance.objects.create(owner=capable, name="worker copy", command=["true"])
    client.force_login(capable)
    page = client.get(f"/instances/{source.pk}/duplicate").content.decode()
    assert 'value="worker copy 2"' in page


@pytest.mark.parametrize("bad", [f"evil{RLO}gnp.exe", f"kid{ZWSP}", "tab\there", "bell\x07"])
def test_invisible_characters_are_refused_in_names_on_every_surface(api, client, capable, staff, bad):
    answer = api("post", "/v1/instances", {"name": bad, "command": ["true"]})
    assert answer.status_code == 400, answer.content
    assert "invisible or control character" in json.dumps(answer.json())
    label = api("post", "/v1/credentials", {"label": bad, "secret": KEY})
    assert label.status_code == 400 and "invisible" in json.dumps(label.json())
    client.force_login(capable)
    token = client.post("/tokens/", {"name": bad, "days": ""})
    assert token.status_code == 400 and "invisible or control character" in token.content.decode()
    with pytest.raises(ValueError, match="invisible"):
        make_token(capable, name=bad)
    client.force_login(staff)
    admin = client.post("/admin/instances/instance/add/", admin_form(staff, name=bad))
    assert admin.status_code == 400 and "invisible or control character" in admin.content.decode()
    assert not Instance.objects.filter(name=bad).exists() and not Credential.objects.filter(label=bad).exists()


def test_a_visible_unicode_name_is_accepted(api):
    assert api("post", "/v1/instances", {"name": "Café 用户 ☕", "command": ["true"]}).status_code == 201


def test_delegate_to_an_ambiguous_name_refuses_and_says_so(capable, make_instance, tmp_path):
    """Two instances named alike (saved before names were unique): delegate refuses instead of picking one."""
    from loops import delegation
    from loops.models import Run

    parent = make_instance(capable, name="lead", tools=["delegate"])
    make_instance(capable, name="kid")
    make_instance(capable, name="kid")  # straight to the database: an older pair
    run = Run.objects.create(instance=parent, owner=capable, objective="x", max_iterations=3)
    with pytest.raises(delegation.Refusal, match="names more than one of your instances"):
        delegation._resolve(run, "kid", "own")


# --- item 11: keys with the shape of a key, names not cut ---------------------------------------


@pytest.mark.parametrize(
    "secret, message",
    [("abc", "20 to 400 characters"), ("sk-ant-" + "a" * 100_000, "100,007"),
     ("sk-ant-api03 with spaces in it", "no spaces"), ("pk-live-" + "x" * 40, "does not look like an Anthropic API key")],
)
def test_implausible_keys_are_refused_on_every_surface(api, client, capable, staff, secret, message):
    answer = api("post", "/v1/credentials", {"label": "k", "secret": secret})
    assert answer.status_code in (400, 422) and message in json.dumps(answer.json()), answer.content[:500]
    client.force_login(capable)
    console = client.post("/credentials/", {"label": "k", "secret": secret})
    assert console.status_code == 400 and message in console.content.decode()
    client.force_login(staff)
    admin = client.post("/admin/instances/credential/add/", {"owner": staff.pk, "label": "k", "secret": secret})
    assert admin.status_code == 200 and message in admin.content.decode()
    assert not Credential.objects.exists()
    assert api("post", "/v1/credentials", {"label": "k", "secret": KEY}).status_code == 201


def test_a_long_token_name_is_refused_with_a_message_not_cut(client, capable):
    client.force_login(capable)
    page = client.get("/tokens/").content.decode()
    assert 'name="name"' in page and "maxlength" not in page.split('name="name"')[1].split(">")[0]
    answer = client.post("/tokens/", {"name": "n" * 5000, "days": ""})
    assert answer.status_code == 400
    assert "at most 100 characters; this one has 5000" in answer.content.decode()
    from loops.models import ApiToken

    assert not ApiToken.objects.filter(user=capable, name__startswith="nnn").exists()


@pytest.mark.parametrize("name", ["ada", "josé 1", "😀 ok", "\u202eevil", "a\u200bb", "tab\there", "line\u2028two", "x\u0085"])
def test_the_api_schema_states_the_name_rule_the_server_checks(name):
    """schemathesis generates names from the schema's pattern: it must allow exactly what `invisible` allows."""
    import re

    from instances.schemas import CredentialIn, InstanceIn
    from instances.validation import invisible

    for schema, field in ((InstanceIn, "name"), (CredentialIn, "label")):
        pattern = re.compile(schema.model_json_schema()["properties"][field]["pattern"])
        assert bool(pattern.match(name)) == (invisible(name) is None), (schema.__name__, name)


def test_the_api_schema_states_the_key_shape_the_server_checks():
    import re

    from instances.schemas import CredentialIn
    from instances.validation import key_problem

    pattern = re.compile(CredentialIn.model_json_schema()["properties"]["secret"]["pattern"])
    for key in ["sk-ant-" + "a" * 13, "sk-ant-" + "a" * 12, "sk-ant-" + "b_-9" * 98, "sk-ant-" + "a" * 394, "sk-ant-a b" + "c" * 20, "abc"]:
        assert bool(pattern.match(key)) == (key_problem(key) is None), key
