"""Capabilities: who may define what runs, where, and where model traffic (and the server's key) goes.

A user without `instances.run_programs` creates instances only from templates and overrides only
the safe fields, through the API and through admin alike; a refusal is a 403 with a message and
saves nothing. Workspaces stay in the user's own area (or an operator-allowed root). `base_url`
may not name this machine or a private host, and the server-wide key never goes to an
instance's own `base_url`.
"""

import json

import pytest
from django.contrib.auth.models import Permission

from instances.models import Instance
from tests.fakes.messages_server import MessagesServer
from web.auth import make_token

pytestmark = pytest.mark.django_db

SERVER_KEY = "sk-ant-api03-SERVERWIDEKEY-0123456789abcdefQRST"


def grant(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs", content_type__app_label="instances"))
    return type(user).objects.get(pk=user.pk)  # a fresh object: permissions are cached per object


@pytest.fixture
def api(client):
    def call(user, body):
        return client.post(
            "/v1/instances",
            data=json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {make_token(user)}"},
        )

    return call


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "brain": "command", "command": ["sh", "-c", "cat /etc/passwd"]},
        {"name": "x", "template": "coder", "checks": [{"name": "t", "command": ["true"]}]},
        {"name": "x", "template": "coder", "command": ["true"]},
        {"name": "x", "template": "coder", "env": {"A": "b"}},
        {"name": "x", "template": "coder", "base_url": "https://api.example.com"},
        {"name": "x", "template": "coder", "network": True},
        {"name": "x", "template": "coder", "tools": ["run_command"]},
        {"name": "x", "template": "coder", "approval_tools": []},
        {"name": "x", "template": "coder", "protected_paths": []},
        {"name": "x", "template": "coder", "protect_defaults": False},
        {"name": "x", "template": "coder", "workspace": "/mnt/elsewhere/project"},
    ],
)
def test_without_the_capability_programs_and_guardrails_are_refused(api, user, body):
    answer = api(user, body)
    assert answer.status_code == 403, answer.content
    assert "run_programs" in answer.json()["error"]
    assert not Instance.objects.exists()


def test_without_the_capability_a_template_with_safe_overrides_is_fine(api, user, settings, price):
    answer = api(user, {"name": "mine", "template": "coder", "max_iterations": 4, "model": "claude-test-1"})
    assert answer.status_code == 201, answer.content
    made = Instance.objects.get()
    assert made.max_iterations == 4 and made.command == [] and made.protect_defaults
    assert "conftest.py" in answer.json()["protected"]  # what is protected, shown
    assert made.workspace_path() == settings.TETHER_WORKSPACES / str(user.pk) / str(made.pk)


def test_with_the_capability_a_user_defines_programs(api, user):
    user = grant(user)
    answer = api(user, {"name": "x", "brain": "command", "command": ["ruff", "check", "."]})
    assert answer.status_code == 201, answer.content


@pytest.mark.parametrize("where", ["/", "/etc", "/usr/lib", "/proc/1", "HOME", "HOME/workspaces/OTHER/1", "relative/dir"])
def test_workspaces_outside_your_area_are_refused_even_with_the_capability(api, user, other_user, settings, where):
    user = grant(user)
    where = where.replace("HOME", str(settings.TETHER_HOME)).replace("OTHER", str(other_user.pk))
    settings.TETHER_WORKSPACES = settings.TETHER_HOME / "workspaces"
    answer = api(user, {"name": "x", "brain": "command", "command": ["true"], "workspace": where})
    assert answer.status_code == 403, answer.content
    assert "workspace" in answer.json()["error"]
    assert not Instance.objects.exists()


def test_workspaces_in_your_area_or_an_allowed_root(api, user, settings, tmp_path):
    settings.TETHER_WORKSPACES = tmp_path / "workspaces"
    mine = settings.TETHER_WORKSPACES / str(user.pk) / "project"
    assert api(user, {"name": "a", "template": "coder", "workspace": str(mine)}).status_code == 201
    elsewhere = tmp_path / "srv" / "repos" / "app"
    refused = api(user, {"name": "b", "template": "coder", "workspace": str(elsewhere)})
    assert refused.status_code == 403 and "run_programs" in refused.json()["error"]
    user = grant(user)
    assert api(user, {"name": "b", "brain": "command", "command": ["true"], "workspace": str(elsewhere)}).status_code == 403
    settings.TETHER_WORKSPACE_ROOTS = [tmp_path / "srv"]
    assert api(user, {"name": "b", "brain": "command", "command": ["true"], "workspace": str(elsewhere)}).status_code == 201


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:5432", "http://localhost:8000", "http://169.254.169.254/latest", "http://10.1.2.3",
            "http://[::1]:9", "http://192.168.0.1"]
)
def test_base_url_may_not_name_this_machine_or_a_private_host(api, user, url):
    user = grant(user)
    answer = api(user, {"name": "x", "template": "coder", "base_url": url})
    assert answer.status_code == 403, answer.content
    assert "base_url" in answer.json()["error"]
    assert not Instance.objects.exists()


def test_an_operator_may_allow_private_base_urls(api, user, settings):
    user = grant(user)
    settings.TETHER_ALLOW_PRIVATE_BASE_URLS = True
    assert api(user, {"name": "x", "template": "coder", "base_url": "http://127.0.0.1:9"}).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_the_server_key_never_goes_to_an_instance_base_url(user, make_instance, monkeypatch, price):
    from loops import services

    monkeypatch.setenv("ANTHROPIC_API_KEY", SERVER_KEY)
    with MessagesServer(api_key=SERVER_KEY) as elsewhere:
        inst = make_instance(user, brain="anthropic", decider="checks", command=[], base_url=elsewhere.url,
                             model="claude-test-1")
        with pytest.raises(services.Refused, match="only ever sent to the operator's endpoint"):
            services.run_start(instance=inst, user=user, objective="call home")
        from instances.credentials import resolve_api_key

        assert resolve_api_key(inst) is None
        assert elsewhere.calls == 0


@pytest.mark.django_db(transaction=True)
def test_the_server_key_goes_to_the_operators_endpoint(user, make_instance, monkeypatch, price):
    from instances.credentials import resolve_api_key, resolve_base_url

    with MessagesServer(api_key=SERVER_KEY) as operators:
        monkeypatch.setenv("ANTHROPIC_API_KEY", SERVER_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", operators.url)
        inst = make_instance(user, brain="anthropic", decider="checks", command=[], model="claude-test-1")
        assert resolve_api_key(inst) == SERVER_KEY and resolve_base_url(inst) == operators.url.rstrip("/")


# --- admin -------------------------------------------------------------------------------


@pytest.fixture
def staff(django_user_model):
    person = django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)
    person.user_permissions.add(*Permission.objects.filter(content_type__app_label="instances",
                                                           codename__in=["add_instance", "change_instance",
                                                                         "view_instance"]))
    return person


def admin_form(owner, **fields):
    data = {
        "owner": owner.pk, "name": "via-admin", "brain": "command", "decider": "checks", "max_iterations": 3,
        "workspace": "", "model": "", "system_prompt": "", "base_url": "", "tools": "[]", "command_allow": "[]",
        "command_deny": "[]", "approval_tools": "[]", "max_tool_turns": 20, "max_output_tokens": 16000,
        "tool_timeout_seconds": 120, "act_timeout_seconds": 600, "objective_max_chars": 8000,
        "command": "[]", "env": "{}", "checks": "[]", "protected_paths": "[]",
    }
    data.update(fields)
    return data


def test_admin_refuses_programs_to_staff_without_the_capability(client, staff):
    client.force_login(staff)
    answer = client.post("/admin/instances/instance/add/", admin_form(staff, command='["sh", "-c", "id"]'))
    assert answer.status_code == 403
    assert "run_programs" in answer.content.decode()
    assert not Instance.objects.exists()


def test_admin_lets_staff_with_the_capability_define_programs(client, staff):
    staff = grant(staff)
    client.force_login(staff)
    answer = client.post("/admin/instances/instance/add/", admin_form(staff, command='["ruff", "check", "."]'))
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert Instance.objects.get().command == ["ruff", "check", "."]


def test_admin_refuses_a_changed_command_on_an_existing_instance(client, staff):
    inst = Instance.objects.create(owner=staff, name="kept", command=["true"])
    client.force_login(staff)
    answer = client.post(f"/admin/instances/instance/{inst.pk}/change/",
                         admin_form(staff, name="kept", command='["sh", "-c", "id"]'))
    assert answer.status_code == 403
    inst.refresh_from_db()
    assert inst.command == ["true"]

