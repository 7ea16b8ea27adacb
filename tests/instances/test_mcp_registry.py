"""The MCP server registry: an operator registers servers in admin; a user enables only the ones granted."""

import json

import pytest
from django.contrib.auth.models import Group, Permission

from instances import services
from instances.models import Instance, McpServer
from web.auth import make_token

pytestmark = pytest.mark.django_db

TOKEN = "ghp_" + "s3cr3t" * 6


@pytest.fixture
def registered():
    def register(name="notes", **fields):
        fields.setdefault("command", ["/opt/mcp/notes"])
        return McpServer.objects.create(name=name, **fields)

    return register


@pytest.fixture
def api(client, user):
    token = make_token(user)

    def call(method, path, body=None):
        return getattr(client, method)(
            path,
            data=json.dumps(body) if body is not None else None,
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )

    return call


def create(user, **values):
    name = f"helper {Instance.objects.filter(owner=user).count() + 1}"  # an owner's names are unique
    return services.instance_create(user=user, values={"name": name, **values}, template="coder")


def test_a_user_enables_only_servers_granted_to_them(user, other_user, registered):
    registered("notes").users.add(other_user)
    registered("search", everyone=True)
    team = Group.objects.create(name="docs-team")
    registered("docs").groups.add(team)

    for names in (["notes"], ["ghost"], ["search", "notes"], ["docs"]):
        with pytest.raises(services.InstanceRefused) as refused:
            create(user, mcp_servers=names)
        assert refused.value.status == 403 and "is not one you may use" in refused.value.message
    # An unknown name and one not granted read the same: the refusal does not reveal what exists.
    assert "yours: search" in refused.value.message and "notes" not in refused.value.message

    assert create(user, mcp_servers=["search"]).mcp_servers == ["search"]
    user.groups.add(team)
    assert create(user, mcp_servers=["docs", "search"]).mcp_servers == ["docs", "search"]
    assert create(other_user, mcp_servers=["notes"]).mcp_servers == ["notes"]


def test_a_server_turned_off_cannot_be_enabled_and_a_malformed_list_is_a_400(user, registered):
    registered("notes", everyone=True, enabled=False)
    with pytest.raises(services.InstanceRefused) as refused:
        create(user, mcp_servers=["notes"])
    assert refused.value.status == 403
    for bad in (["mcp__x"], ["a__b"], [""], [1], "notes", ["search", "search"]):
        registered_bad = bad
        with pytest.raises(services.InstanceRefused) as refused:
            create(user, mcp_servers=registered_bad)
        assert refused.value.status == 400 and refused.value.field == "mcp_servers", bad


def test_updating_an_instance_checks_the_servers_it_adds(user, registered):
    registered("search", everyone=True)
    registered("notes")
    instance = create(user, mcp_servers=["search"])
    with pytest.raises(services.InstanceRefused) as refused:
        services.instance_update(instance=instance, user=user, values={"mcp_servers": ["search", "notes"]})
    assert refused.value.status == 403
    instance.refresh_from_db()
    assert instance.mcp_servers == ["search"]
    updated = services.instance_update(instance=instance, user=user, values={"mcp_servers": []})
    assert updated.mcp_servers == []


def test_the_api_refuses_a_server_not_granted_with_a_json_403(api, registered):
    registered("notes")
    registered("search", everyone=True)
    refused = api("post", "/v1/instances", {"name": "a", "template": "coder", "mcp_servers": ["notes"]})
    assert refused.status_code == 403 and "is not one you may use" in refused.json()["error"]
    unknown = api("post", "/v1/instances", {"name": "a", "template": "coder", "mcp_servers": ["ghost"]})
    assert unknown.status_code == 403
    made = api("post", "/v1/instances", {"name": "a", "template": "coder", "mcp_servers": ["search"]})
    assert made.status_code == 201 and made.json()["mcp_servers"] == ["search"]


def test_admin_registers_a_stdio_server_with_write_only_secrets(admin_client):
    form = {
        "name": "notes",
        "description": "team notes",
        "transport": "stdio",
        "command": '["/opt/mcp/notes"]',
        "url": "",
        "tool_allow": "[]",
        "tool_deny": '["delete_*"]',
        "approval_tools": '["record"]',
        "timeout_seconds": 30,
        "enabled": "on",
        "everyone": "on",
        "secret_env": f"NOTES_TOKEN={TOKEN}\n",
        "secret_headers": "",
    }
    response = admin_client.post("/admin/instances/mcpserver/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    server = McpServer.objects.get(name="notes")
    assert server.secrets()["env"] == {"NOTES_TOKEN": TOKEN} and TOKEN not in server.secrets_encrypted
    assert server.secret_names == ["env NOTES_TOKEN"] and server.tool_deny == ["delete_*"]
    for url in ["/admin/instances/mcpserver/", f"/admin/instances/mcpserver/{server.pk}/change/"]:
        page = admin_client.get(url).content.decode()
        assert TOKEN not in page
    change = f"/admin/instances/mcpserver/{server.pk}/change/"
    assert "env NOTES_TOKEN" in admin_client.get(change).content.decode()
    # Saving without typing the secret again keeps it.
    assert admin_client.post(change, {**form, "secret_env": "", "description": "notes"}).status_code == 302
    server.refresh_from_db()
    assert server.secrets()["env"] == {"NOTES_TOKEN": TOKEN} and server.description == "notes"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/mcp", "http://169.254.169.254/mcp", "ftp://example.com/"]
)
def test_admin_refuses_an_http_server_on_a_private_address_unless_allowed(admin_client, url):
    form = {
        "name": "local",
        "transport": "http",
        "command": "[]",
        "url": url,
        "tool_allow": "[]",
        "tool_deny": "[]",
        "approval_tools": "[]",
        "timeout_seconds": 30,
        "enabled": "on",
    }
    refused = admin_client.post("/admin/instances/mcpserver/add/", form)
    assert refused.status_code == 200 and not McpServer.objects.exists()
    assert (
        "loopback, link-local or private" in refused.content.decode()
        or "http:// or https://" in refused.content.decode()
    )
    if url.startswith("http"):
        allowed = admin_client.post("/admin/instances/mcpserver/add/", {**form, "allow_private_url": "on"})
        assert allowed.status_code == 302 and McpServer.objects.get(name="local").url == url


def test_a_stdio_server_needs_a_command_and_a_bad_name_is_refused(admin_client):
    base = {
        "transport": "stdio",
        "url": "",
        "tool_allow": "[]",
        "tool_deny": "[]",
        "approval_tools": "[]",
        "timeout_seconds": 30,
    }
    assert (
        admin_client.post(
            "/admin/instances/mcpserver/add/", {**base, "name": "x", "command": "[]"}
        ).status_code
        == 200
    )
    bad = admin_client.post("/admin/instances/mcpserver/add/", {**base, "name": "a__b", "command": '["x"]'})
    assert bad.status_code == 200 and not McpServer.objects.exists()


def test_only_an_operator_reaches_the_registry(client, user, registered):
    registered("notes")
    user.is_staff = True
    user.save()
    client.force_login(user)
    assert client.get("/admin/instances/mcpserver/").status_code == 403
    assert client.post("/admin/instances/mcpserver/add/", {"name": "mine"}).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_mcpserver"))
    assert client.get("/admin/instances/mcpserver/").status_code == 200
    assert client.post("/admin/instances/mcpserver/add/", {"name": "mine"}).status_code == 403


def test_rotating_the_secret_key_re_encrypts_mcp_server_secrets(settings):
    from instances import credentials

    settings.SECRET_KEY = "old-secret-" + "x" * 40
    server = McpServer(name="notes", command=["/opt/mcp/notes"])
    server.set_secrets(env={"NOTES_TOKEN": TOKEN}, headers={"Authorization": "Bearer " + TOKEN})
    server.save()
    settings.SECRET_KEY = "new-secret-" + "y" * 40
    settings.SECRET_KEY_FALLBACKS = ["old-secret-" + "x" * 40]
    assert credentials.rotate() == 1
    settings.SECRET_KEY_FALLBACKS = []
    assert McpServer.objects.get(pk=server.pk).secrets() == {
        "env": {"NOTES_TOKEN": TOKEN},
        "headers": {"Authorization": "Bearer " + TOKEN},
    }


def admin_instance_form(owner, **fields):
    data = {
        "owner": owner.pk,
        "name": "via-admin",
        "brain": "command",
        "decider": "checks",
        "max_iterations": 3,
        "workspace": "",
        "model": "",
        "system_prompt": "",
        "base_url": "",
        "tools": "[]",
        "command_allow": "[]",
        "command_deny": "[]",
        "approval_tools": "[]",
        "max_tool_turns": 20,
        "max_output_tokens": 16000,
        "tool_timeout_seconds": 120,
        "act_timeout_seconds": 600,
        "objective_max_chars": 8000,
        "command": '["true"]',
        "env": "{}",
        "checks": "[]",
        "protected_paths": "[]",
        "mcp_servers": "[]",
    }
    return {**data, **fields}


def test_the_instance_admin_checks_mcp_servers_like_every_surface(
    client, admin_client, admin_user, registered
):
    from instances.models import Instance

    registered("notes")
    bad = admin_client.post(
        "/admin/instances/instance/add/", admin_instance_form(admin_user, mcp_servers='["a__b"]')
    )
    assert bad.status_code == 200 and "mcp_servers must be a list of MCP server names" in bad.content.decode()
    made = admin_client.post(
        "/admin/instances/instance/add/", admin_instance_form(admin_user, mcp_servers='["notes"]')
    )
    assert made.status_code == 302 and Instance.objects.get().mcp_servers == ["notes"]

    staff = type(admin_user).objects.create_user("sam", password="pw-sam-123", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["add_instance", "change_instance", "view_instance", "run_programs"]
        )
    )
    client.force_login(staff)
    refused = client.post(
        "/admin/instances/instance/add/", admin_instance_form(staff, name="sams", mcp_servers='["notes"]')
    )
    assert refused.status_code == 403 and "is not one you may use" in refused.content.decode()
    assert not Instance.objects.filter(owner=staff).exists()
