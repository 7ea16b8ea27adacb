"""The whole audit trail: every person's change to what agents may do or spend, with before and after.

Each action is made through a real surface (the admin, the console, the API, the CLI, a sign-in page)
and found in the trail with who, how and what changed; secrets never land in it. The pool page, the
instance page and the person's page show their entries, and another user sees none of them there or
in the CSV. The actions the docs list are exactly the ones recorded (`audit.trail.ACTIONS`).
"""

import csv
import io
import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.urls import reverse

from audit import trail
from audit.models import AuditEntry
from budgets import services as budget_services
from budgets.models import Pool, Price
from instances.models import AgentTemplate, Credential, McpServer
from loops import services
from loops.models import Run
from tests.instances.test_mcp_registry import admin_instance_form
from web.auth import make_token

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-ant-api03-AUDITTRAILKEY-0123456789abcdefWXYZ"


@pytest.fixture(autouse=True)
def programmers(user, other_user):
    """Both may define programs, so their hand-made test instances can be edited."""
    permission = Permission.objects.get(codename="run_programs")
    user.user_permissions.add(permission)
    other_user.user_permissions.add(permission)


def entry(action: str, **filters) -> AuditEntry:
    found = list(AuditEntry.objects.filter(action=action, **filters).order_by("-id"))
    assert found, (
        f"no {action} entry; the trail has {list(AuditEntry.objects.values_list('action', flat=True))}"
    )
    return found[0]


def trail_text() -> str:
    return json.dumps(list(AuditEntry.objects.values()), default=str)


# --- pools: create, limit, top-up, period reset, name and threshold, a run's cap ----------------------


def pool_form(pool, **fields):
    return {"name": pool.name, "threshold_percent": 80, "limit_usd": "", "top_up_usd": "", **fields}


def test_pool_changes_made_in_the_admin_are_recorded_with_before_and_after(admin_client, admin_user, user):
    pool = budget_services.user_pool(user)
    change = reverse("admin:budgets_pool_change", args=[pool.pk])
    assert admin_client.post(change, pool_form(pool, limit_usd="5")).status_code == 302
    limit = entry("pool.limit", pool=pool)
    assert (limit.user, limit.via, limit.owner) == (admin_user, "admin", user)
    assert limit.detail["before"] == {"limit": None} and limit.detail["after"] == {"limit": "5.000000"}

    assert admin_client.post(change, pool_form(pool, limit_usd="5", top_up_usd="2.5")).status_code == 302
    top_up = entry("pool.top_up", pool=pool)
    assert top_up.detail["before"] == {"limit": "5.000000"} and top_up.detail["after"] == {
        "limit": "7.500000"
    }

    assert (
        admin_client.post(
            change, pool_form(pool, limit_usd="7.5", name="ada's", threshold_percent=50)
        ).status_code
        == 302
    )
    update = entry("pool.update", pool=pool)
    assert update.detail["before"] == {"name": pool.name, "threshold_percent": 80}
    assert update.detail["after"] == {"name": "ada's", "threshold_percent": 50}

    add = reverse("admin:budgets_pool_add")
    made = admin_client.post(
        add,
        {
            "name": "team",
            "kind": "team",
            "parent": budget_services.root_pool().pk,
            "owner": "",
            "instance": "",
            "run": "",
            "period": "monthly",
            "threshold_percent": 80,
            "limit_usd": "100",
        },
    )
    assert made.status_code == 302, made.content.decode()[:1500]
    team = Pool.objects.get(name="team")
    created = entry("pool.create", pool=team)
    assert created.via == "admin" and created.detail["after"]["limit"] == "100.000000"
    assert created.detail["after"]["period"] == "monthly" and created.detail["before"] == {}

    changelist = reverse("admin:budgets_pool_changelist")
    reset = admin_client.post(changelist, {"action": "reset_period", "_selected_action": [team.pk]})
    assert reset.status_code == 302
    assert entry("pool.period_reset", pool=team).detail["after"] == {"spent": "0"}

    # The operator's pool page in the admin lists the changes too.
    page = admin_client.get(change).content.decode()
    assert "pool.limit" in page and "pool.top_up" in page and "5.000000 → 7.500000" in page


def test_a_cap_raised_to_resume_a_run_is_recorded_through_the_api(client, user, make_instance):
    instance = make_instance(user)
    run = services.run_start(instance=instance, user=user, objective="spend", max_cost_usd="0.5")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, outcome=Run.Outcome.BUDGET_EXHAUSTED)
    token = make_token(user)
    answer = client.post(
        f"/v1/instances/{instance.pk}/loop/{run.pk}/resume",
        {"max_cost_usd": "2"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert answer.status_code in (200, 202), answer.content
    cap = entry("pool.cap", run=run)
    assert (cap.user, cap.via, cap.owner) == (user, "api", user)
    assert cap.detail["before"] == {"cap": "0.500000"} and cap.detail["after"] == {"cap": "2.000000"}
    assert entry("run.resume", run=run).via == "api"


def test_closing_a_waiting_run_and_keys_added_and_removed_through_the_api_are_recorded(
    client, user, make_instance
):
    instance = make_instance(user)
    run = services.run_start(instance=instance, user=user, objective="ask")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.WAITING)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {make_token(user)}", "content_type": "application/json"}
    assert client.post(f"/v1/instances/{instance.pk}/loop/{run.pk}/close", {}, **auth).status_code in (
        200,
        202,
    )
    assert entry("run.close", run=run).via == "api"

    made = client.post("/v1/credentials", {"label": "work", "secret": KEY}, **auth)
    assert made.status_code == 201, made.content
    added = entry("credential.add", via="api")
    assert added.owner == user and added.detail["after"]["label"] == "work"
    assert added.detail["after"]["secret_encrypted"].startswith(trail.REDACTED)
    assert client.delete(f"/v1/credentials/{made.json()['id']}", **auth).status_code == 200
    removed = entry("credential.remove", via="api")
    assert removed.detail["before"]["label"] == "work" and removed.detail["after"] == {}
    assert KEY not in trail_text()


# --- instances, templates, credentials, prices, MCP servers, capabilities ------------------------------


def test_instance_edits_on_the_console_and_the_api_say_what_changed(client, user, make_instance):
    client.force_login(user)
    made = client.post(
        "/v1/instances", {"template": "program", "name": "made-by-api"}, content_type="application/json"
    )
    assert made.status_code in (200, 201), made.content
    created = entry("instance.create", via="api")
    assert created.instance_id == made.json()["id"] and created.detail["after"]["name"] == "made-by-api"

    instance = make_instance(user, name="editable", max_iterations=3)
    form = client.get(f"/instances/{instance.pk}/edit")
    assert form.status_code == 200
    values = _form_values(form.content.decode().split('class="logout"')[1].split("</form>", 1)[1])
    values.update({"name": "edited", "max_iterations": "7"})
    edited = client.post(f"/instances/{instance.pk}/edit", values)
    assert edited.status_code == 302, edited.content.decode()[:3000]
    update = entry("instance.update", instance=instance)
    assert update.via == "console" and update.owner == user
    assert update.detail["before"]["name"] == "editable" and update.detail["after"]["name"] == "edited"
    assert update.detail["before"]["max_iterations"] == 3 and update.detail["after"]["max_iterations"] == 7

    assert client.post(f"/instances/{instance.pk}/archive").status_code == 302
    assert entry("instance.archive", instance=instance).detail["before"] == {"archived_at": None}
    assert client.post(f"/instances/{instance.pk}/restore").status_code == 302
    assert entry("instance.restore", instance=instance).detail["after"] == {"archived_at": None}


def test_admin_edits_and_deletes_of_an_instance_are_recorded_by_the_admin_hook(
    admin_client, admin_user, user
):
    made = admin_client.post(
        "/admin/instances/instance/add/", admin_instance_form(user, env='{"API_TOKEN": "s3cr3t-value-1234"}')
    )
    assert made.status_code == 302, made.content.decode()[:2000]
    instance = user.instances.get()
    created = entry("instance.create", instance=instance)
    assert (created.user, created.via, created.owner) == (admin_user, "admin", user)
    assert created.detail["after"]["max_iterations"] == 3
    change = f"/admin/instances/instance/{instance.pk}/change/"
    form = admin_instance_form(user, max_iterations=9, env='{"API_TOKEN": "an0ther-value-5678"}')
    assert admin_client.post(change, form).status_code == 302
    update = entry("instance.update", instance=instance)
    assert update.detail["before"]["max_iterations"] == 3 and update.detail["after"]["max_iterations"] == 9
    # The environment changed; its values are not written, only that they changed.
    assert set(update.detail["before"]["env"]) == {"API_TOKEN"} != update.detail["after"]["env"]
    assert (
        admin_client.post(f"/admin/instances/instance/{instance.pk}/delete/", {"post": "yes"}).status_code
        == 302
    )
    deleted = entry("instance.delete", instance_ref=instance.pk)
    assert deleted.detail["before"]["name"] == "via-admin" and deleted.detail["after"] == {}
    assert "s3cr3t-value-1234" not in trail_text() and "an0ther-value-5678" not in trail_text()


def test_templates_prices_mcp_servers_and_credentials_edited_in_the_admin_are_recorded(admin_client, user):
    template = AgentTemplate.objects.create(name="tiny", brain="command", decider="checks", command=["true"])
    page = admin_client.get(f"/admin/instances/agenttemplate/{template.pk}/change/")
    assert page.status_code == 200
    form = {name: value for name, value in _form_values(page.content.decode()).items()}
    form.update({"max_iterations": "4", "description": "smaller"})
    saved = admin_client.post(f"/admin/instances/agenttemplate/{template.pk}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    update = entry("template.update")
    assert update.detail["before"]["max_iterations"] == 10 and update.detail["after"]["max_iterations"] == 4
    assert update.via == "admin"

    price = admin_client.post(
        "/admin/budgets/price/add/",
        {
            "model": "claude-audit-1",
            "effective_from": "2026-01-01",
            "input_usd_per_mtok": "3",
            "output_usd_per_mtok": "15",
            "cache_write_usd_per_mtok": "3.75",
            "cache_read_usd_per_mtok": "0.3",
        },
    )
    assert price.status_code == 302, price.content.decode()[:2000]
    assert entry("price.create").detail["after"]["model"] == "claude-audit-1"
    row = Price.objects.get(model="claude-audit-1")
    assert admin_client.post(f"/admin/budgets/price/{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert entry("price.delete").detail["before"]["output_usd_per_mtok"] == "15.000000"

    server = admin_client.post(
        "/admin/instances/mcpserver/add/",
        {
            "name": "notes",
            "description": "",
            "transport": "stdio",
            "command": '["/opt/mcp/notes"]',
            "url": "",
            "tool_allow": "[]",
            "tool_deny": "[]",
            "approval_tools": "[]",
            "timeout_seconds": 30,
            "enabled": "on",
            "everyone": "on",
            "secret_env": f"NOTES_TOKEN={KEY}\n",
            "secret_headers": "",
        },
    )
    assert server.status_code == 302, server.content.decode()[:2000]
    added = entry("mcp_server.create")
    assert added.detail["after"]["secret_names"] == ["env NOTES_TOKEN"]
    assert added.detail["after"]["secrets_encrypted"].startswith(trail.REDACTED)
    assert McpServer.objects.get(name="notes").secrets()["env"] == {"NOTES_TOKEN": KEY}

    credential = Credential.create_for(user, label="old", secret=KEY.replace("W", "V"))
    changed = admin_client.post(
        f"/admin/instances/credential/{credential.pk}/change/",
        {"owner": user.pk, "label": "renamed", "secret": KEY},
    )
    assert changed.status_code == 302, changed.content.decode()[:2000]
    update = entry("credential.update")
    assert update.owner == user and update.detail["before"]["label"] == "old"
    assert update.detail["after"]["label"] == "renamed"
    assert update.detail["after"]["secret_encrypted"].startswith(trail.REDACTED)
    assert KEY not in trail_text() and KEY.replace("W", "V") not in trail_text()


def test_templates_loaded_by_the_cli_are_recorded_when_they_change(tmp_path):
    data = {
        "name": "cli-made",
        "description": "tiny",
        "brain": "command",
        "decider": "checks",
        "command": ["true"],
        "max_iterations": 3,
    }
    (tmp_path / "cli-made.json").write_text(json.dumps(data))
    call_command("loadtemplates", str(tmp_path), stdout=io.StringIO())
    created = entry("template.create", via="cli")
    assert created.detail["after"]["max_iterations"] == 3 and created.user_agent.startswith("manage.py on ")
    call_command("loadtemplates", str(tmp_path), stdout=io.StringIO())  # unchanged: nothing new
    assert not AuditEntry.objects.filter(action="template.update").exists()
    (tmp_path / "cli-made.json").write_text(json.dumps({**data, "max_iterations": 5}))
    call_command("loadtemplates", str(tmp_path), stdout=io.StringIO())
    update = entry("template.update", via="cli")
    assert update.detail["before"] == {"max_iterations": 3} and update.detail["after"] == {
        "max_iterations": 5
    }


def _form_values(html: str) -> dict[str, str]:
    """Return the values an admin change form posts as it stands (inputs, selects, textareas)."""
    values: dict[str, str] = {}
    for tag in re.findall(r"<input[^>]*>", html):
        name = re.search(r'name="([^"]+)"', tag)
        kind = re.search(r'type="([^"]+)"', tag)
        if not name or (kind and kind.group(1) in ("submit", "button", "file")):
            continue
        if kind and kind.group(1) == "checkbox":
            if "checked" in tag:
                values[name.group(1)] = "on"
            continue
        value = re.search(r'value="([^"]*)"', tag)
        values[name.group(1)] = _unescape(value.group(1)) if value else ""
    for name, body in re.findall(r'<textarea[^>]*name="([^"]+)"[^>]*>(.*?)</textarea>', html, re.S):
        values[name] = _unescape(body.lstrip("\n"))
    for name, body in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', body)
        values[name] = chosen.group(1) if chosen else ""
    return values


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_a_capability_granted_in_the_admin_is_recorded_on_the_person(admin_client, admin_user, user):
    user.user_permissions.clear()
    page = admin_client.get(f"/admin/auth/user/{user.pk}/change/")
    form = _form_values(page.content.decode())
    permission = Permission.objects.get(codename="run_programs")
    form["user_permissions"] = str(permission.pk)
    form.pop("groups", None)
    form.pop("password", None)
    form.setdefault("date_joined_0", "2026-01-01")
    form.setdefault("date_joined_1", "00:00:00")
    saved = admin_client.post(f"/admin/auth/user/{user.pk}/change/", form)
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    granted = entry("user.update", owner=user)
    assert granted.user == admin_user and granted.via == "admin"
    assert granted.detail["before"]["user_permissions"] == []
    assert "Can define programs" in granted.detail["after"]["user_permissions"][0]
    assert "password" not in granted.detail["after"] and "pbkdf2" not in trail_text()

    group = admin_client.post("/admin/auth/group/add/", {"name": "builders", "permissions": [permission.pk]})
    assert group.status_code == 302, group.content.decode()[:2000]
    made = entry("group.create")
    assert made.detail["after"]["name"] == "builders" and len(made.detail["after"]["permissions"]) == 1
    assert Group.objects.filter(name="builders").exists()


# --- tokens and sign-in lockouts ----------------------------------------------------------------------


def test_tokens_issued_and_revoked_on_the_console_and_the_cli_are_recorded_without_their_value(client, user):
    client.force_login(user)
    assert client.post("/tokens/", {"name": "laptop", "days": ""}).status_code == 303
    shown = client.get("/tokens/").content.decode()
    value = re.search(r"tth_[A-Za-z0-9_\-]+", shown).group(0)
    issued = entry("token.issue", via="console")
    assert (issued.user, issued.owner) == (user, user) and issued.detail["after"]["name"] == "laptop"
    token_id = issued.detail["token"]
    assert client.post(f"/tokens/{token_id}/revoke").status_code == 302
    revoked = entry("token.revoke", via="console")
    assert revoked.detail["before"]["prefix"] == value[:8] and revoked.detail["after"] == {}

    out = io.StringIO()
    call_command("token", "create", "ada", "--name", "ci", stdout=out)
    cli = entry("token.issue", via="cli")
    assert cli.owner == user and cli.user is None and cli.user_agent.startswith("manage.py on ")
    call_command("token", "revoke", str(cli.detail["token"]), stdout=io.StringIO())
    assert entry("token.revoke", via="cli").owner == user
    text = trail_text()
    assert value not in text and out.getvalue().strip() not in text


def test_a_sign_in_lockout_is_recorded_on_the_account_it_names(client, user, settings):
    settings.TETHER_LOGIN_FAILURE_LIMIT = 3
    for n in range(8):  # three wrong passwords lock the account; five more tries are refused
        client.post("/login/", {"username": "ada", "password": f"guess-{n}"}, REMOTE_ADDR="192.0.2.9")
    assert AuditEntry.objects.filter(action="signin.locked_out").count() == 1  # one lockout, one entry
    locked = entry("signin.locked_out")
    assert (locked.owner, locked.user, locked.via) == (user, None, "console")
    assert locked.detail["username"] == "ada" and locked.ip_address == "192.0.2.9"
    assert "guess-" not in trail_text()


def test_a_lockout_on_the_admin_sign_in_says_so(client, django_user_model, settings):
    settings.TETHER_LOGIN_FAILURE_LIMIT = 2
    root = django_user_model.objects.create_superuser("root", email="", password="pw-root-123")
    for n in range(2):
        client.post("/admin/login/", {"username": "root", "password": f"guess-{n}"})
    assert entry("signin.locked_out", owner=root).via == "admin"


# --- pages: the pool, the instance, the person; nobody else's entries ---------------------------------


def test_the_pool_page_shows_its_changes_newest_first_and_only_to_its_owner(
    client, user, other_user, admin_user
):
    pool = budget_services.user_pool(user)
    budget_services.pool_set_limit(pool, 5_000_000, user=admin_user, via="admin")
    budget_services.pool_set_limit(pool, 9_000_000, user=admin_user, via="admin")
    client.force_login(user)
    page = client.get(f"/pools/{pool.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.index("→ 9.000000") < html.index("→ 5.000000")  # newest first
    assert html.count('data-action="pool.limit"') == 2
    client.force_login(other_user)
    assert client.get(f"/pools/{pool.pk}/").status_code == 404


def test_the_budget_page_links_to_the_pools_the_person_may_open(client, user, make_instance):
    instance = make_instance(user)
    services.run_start(instance=instance, user=user, objective="go")
    client.force_login(user)
    html = client.get(f"/instances/{instance.pk}/budget").content.decode()
    assert f'href="/pools/{budget_services.instance_pool(instance).pk}/"' in html
    assert f'href="/pools/{budget_services.root_pool().pk}/"' not in html  # the operator's root: not theirs


def test_the_instance_page_shows_its_changes_and_never_another_users(client, user, other_user, make_instance):
    mine = make_instance(user, name="mine")
    services_update(mine, user, max_iterations=4)
    theirs = make_instance(other_user, name="theirs")
    services_update(theirs, other_user, max_iterations=6)
    client.force_login(user)
    html = client.get(f"/instances/{mine.pk}/").content.decode()
    assert 'data-action="instance.update"' in html and "max_iterations" in html
    assert client.get(f"/instances/{theirs.pk}/").status_code == 404
    client.force_login(other_user)
    html = client.get(f"/instances/{theirs.pk}/").content.decode()
    assert "→ 6" in html and "→ 4" not in html


def services_update(instance, user, **values):
    from instances import services as instance_services

    return instance_services.instance_update(instance=instance, user=user, values=values, via="console")


def test_the_persons_page_shows_their_trail_and_nobody_elses(
    client, user, other_user, make_instance, settings
):
    settings.TETHER_LOGIN_FAILURE_LIMIT = 2
    services_update(make_instance(user, name="mine"), user, max_iterations=4)
    make_token(other_user, name="bobs", via="console")
    for n in range(2):
        client.post("/login/", {"username": "ada", "password": f"guess-{n}"})
    client.force_login(user)
    page = client.get("/account/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-action="instance.update"' in html and 'data-action="signin.locked_out"' in html
    assert 'data-action="token.issue"' not in html  # bob's
    client.force_login(other_user)
    html = client.get("/account/").content.decode()
    assert 'data-action="token.issue"' in html
    assert 'data-action="instance.update"' not in html and 'data-action="signin.locked_out"' not in html


def test_the_csv_never_holds_another_users_entries(client, user, other_user, make_instance, admin_user):
    theirs = make_instance(other_user, name="theirs")
    services_update(theirs, other_user, max_iterations=6)
    budget_services.pool_set_limit(
        budget_services.user_pool(other_user), 1_000_000, user=admin_user, via="admin"
    )
    make_token(other_user, via="console")
    services_update(make_instance(user, name="mine"), user, max_iterations=4)
    client.force_login(user)
    rows = list(csv.reader(io.StringIO(client.get("/reviews/audit.csv").content.decode())))
    assert [r[2] for r in rows[1:]] == ["instance.update"]


# --- the list of actions is the truth --------------------------------------------------------------


def _listed(text: str) -> set[str]:
    return set(re.findall(r"\b[a-z_]+\.[a-z_]+\b", text))


def test_the_docs_list_exactly_the_actions_recorded():
    docstring = (trail.__doc__ or "").split("docs/guide.md lists too):", 1)[1]
    assert _listed(docstring) == set(trail.ACTIONS)
    guide = (ROOT / "docs" / "guide.md").read_text()
    section = guide.split("<!-- audit-actions -->", 2)[1]
    assert set(re.findall(r"`([a-z_]+\.[a-z_]+)`", section)) == set(trail.ACTIONS)


def _hook_actions() -> set[str]:
    """The actions the admin hook records: noun.verb of every registered admin that mixes it in."""
    from django.contrib import admin

    return {
        f"{model_admin.audit_noun}.{verb}"
        for model_admin in admin.site._registry.values()
        if isinstance(model_admin, trail.AuditedAdmin)
        for verb in model_admin.audit_verbs
    }


def test_every_admin_that_shapes_agents_or_spend_records_through_the_hook():
    from django.contrib import admin

    hooked = {type(a).__name__ for a in admin.site._registry.values() if isinstance(a, trail.AuditedAdmin)}
    assert {
        "InstanceAdmin",
        "AgentTemplateAdmin",
        "CredentialAdmin",
        "McpServerAdmin",
        "PriceAdmin",
        "AuditedUserAdmin",
        "AuditedGroupAdmin",
        "GradingAdmin",
        "NotificationTargetAdmin",
        "TriggerAdmin",
        "ScheduleAdmin",
    } <= hooked
    assert _hook_actions() <= set(trail.ACTIONS)  # record() refuses any other: a new admin must be listed


def test_every_action_a_service_records_is_made_and_found_by_a_test():
    """An action the docs promise (besides the hook's, proven above) is made for real in a test."""
    sources = "\n".join(
        path.read_text() for path in (ROOT / "tests").rglob("test_*.py") if path.name != Path(__file__).name
    )
    sources += Path(__file__).read_text().split("# --- the list of actions is the truth")[0]
    missing = sorted(a for a in set(trail.ACTIONS) - _hook_actions() if f'"{a}"' not in sources)
    assert missing == []


def test_an_action_nobody_documented_is_refused(user):
    with pytest.raises(ValueError, match="unknown action"):
        trail.record(user=user, action="pool.vanish", via="console")
