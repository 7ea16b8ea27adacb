"""Forms a person can trust (issue #26, items 6, 12, 13).

- A refused form comes back with an error summary at its top that takes the focus (autofocus,
  tabindex -1), each problem linked to its field, and the field outlined (aria-invalid, a class):
  instance new/edit, credentials, tokens, notifications; one include, `_form_errors.html`.
- New instance: the templates to start from (a key-free program first) apart from the roles of
  compositions; the brain switch shows only what that brain uses and a program keeps no Claude
  settings; the create form has no edit wording; the instance page shows a command with its quotes.
- Notifications: the Remove button is readable (≥ 4.5:1) and an internationalised address is taken.
"""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission

from instances.models import AgentTemplate, Instance

pytestmark = pytest.mark.django_db

SUMMARY = re.compile(r'<div class="errors error-summary" id="([^"]+)" role="alert" tabindex="-1" autofocus data-error-summary')


@pytest.fixture
def capable(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    return user


def safe_post(template, **changes):
    data = {
        "name": f"my-{template.name}", "model": template.model, "credential": "",
        "max_iterations": template.max_iterations, "objective_max_chars": 8000,
        "max_tool_turns": template.max_tool_turns, "max_output_tokens": template.max_output_tokens, "workspace": "",
    }
    return {**data, **changes}


def full_post(template, **changes):
    data = safe_post(template, brain=template.brain, decider=template.decider, command=" ".join(template.command),
                     checks="", env="", tools=list(template.tools), approval_tools=[], system_prompt=template.system_prompt,
                     command_allow="", command_deny="", protected_paths="", tool_timeout_seconds=120,
                     act_timeout_seconds=600, base_url="")
    return {**data, **changes}


def summary_of(html: str) -> str:
    found = SUMMARY.search(html)
    assert found, "no error summary that takes the focus"
    assert html.count("autofocus") == 1  # the one thing focused on load
    return html[found.start(): html.index("</div>", found.start())]


def test_a_refused_create_shows_the_summary_first_and_outlines_the_field(signed_in):
    triage = AgentTemplate.objects.get(name="triage")
    answer = signed_in.post("/instances/new/triage/", safe_post(triage, max_iterations=0))
    assert answer.status_code == 400
    html = answer.content.decode()
    summary = summary_of(html)
    assert 'href="#id_max_iterations"' in summary and "between 1 and 10000" in summary
    assert html.index("data-error-summary") < html.index('name="name"')  # at the top of the form
    field = re.search(r'<input[^>]*name="max_iterations"[^>]*>', html).group()
    assert 'aria-invalid="true"' in field and 'aria-describedby="id_max_iterations_error"' in field
    assert 'class="form-field field-invalid" data-field="max_iterations"' in html
    assert 'id="id_max_iterations_error"' in html
    # A field without a problem is not outlined.
    assert 'aria-invalid' not in re.search(r'<input[^>]*name="name"[^>]*>', html).group()


def test_a_refused_edit_shows_the_summary_with_a_refusal_from_the_service(signed_in, user):
    triage = AgentTemplate.objects.get(name="triage")
    assert signed_in.post("/instances/new/triage/", safe_post(triage, name="one")).status_code == 302
    assert signed_in.post("/instances/new/triage/", safe_post(triage, name="two")).status_code == 302
    two = Instance.objects.get(name="two")
    answer = signed_in.post(f"/instances/{two.pk}/edit", safe_post(triage, name="one"))
    assert answer.status_code == 409
    summary = summary_of(answer.content.decode())
    assert 'href="#id_name"' in summary and "already have an instance named" in summary


def test_credential_token_and_notification_forms_share_the_summary(signed_in, user):
    key = signed_in.post("/credentials/", {"label": "k", "secret": "abc"})
    assert key.status_code == 400
    html = key.content.decode()
    assert 'href="#id_secret"' in summary_of(html) and "20 to 400 characters" in html
    assert 'aria-invalid="true"' in re.search(r'<input[^>]*name="secret"[^>]*>', html).group()

    token = signed_in.post("/tokens/", {"name": "", "days": ""})
    assert token.status_code == 400
    assert 'href="#id_name"' in summary_of(token.content.decode())

    hook = signed_in.post("/reviews/notifications/", {"kind": "email", "address": "not an address"})
    assert hook.status_code == 400
    html = hook.content.decode()
    assert "is not a valid e-mail address" in summary_of(html)
    address = re.search(r'<input[^>]*name="address"[^>]*>', html).group()
    assert 'aria-invalid="true"' in address and 'value="not an address"' in address  # kept to correct


@pytest.mark.parametrize("address", ["用户@例子.广告", "josé@exemple.fr", "ada@例え.jp", "josé@bücher.example"])
def test_an_internationalised_email_address_is_taken(signed_in, user, address):
    from reviews.models import NotificationTarget

    answer = signed_in.post("/reviews/notifications/", {"kind": "email", "address": address})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    assert NotificationTarget.objects.get(owner=user).address == address


@pytest.mark.parametrize("address", ["a b@example.com", "ada@", "\u202eada@example.com", "ada@exa mple.com"])
def test_a_broken_email_address_is_still_refused(signed_in, address):
    assert signed_in.post("/reviews/notifications/", {"kind": "email", "address": address}).status_code == 400


def _luminance(hex_colour: str) -> float:
    hex_colour = hex_colour.lstrip("#")
    if len(hex_colour) == 3:
        hex_colour = "".join(c * 2 for c in hex_colour)
    channels = [int(hex_colour[i: i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def test_the_notifications_remove_button_is_readable(signed_in, user):
    from reviews.models import NotificationTarget

    NotificationTarget.objects.create(owner=user, kind="email", address="ada@example.com")
    html = signed_in.get("/reviews/notifications/").content.decode()
    button = re.search(r'<button[^>]*>Remove</button>', html).group()
    assert 'class="danger"' in button
    css = (Path(settings.BASE_DIR) / "static" / "console" / "console.css").read_text()
    bad = re.search(r"--bad:\s*(#[0-9a-fA-F]{3,6})", css).group(1)
    rule = re.search(r"button\.danger\s*\{([^}]*)\}", css).group(1)
    assert "var(--bad)" in rule and "color: #fff" in rule
    light, dark = sorted([_luminance("#fff"), _luminance(bad)], reverse=True)
    assert (light + 0.05) / (dark + 0.05) >= 4.5


def test_templates_are_grouped_start_here_apart_from_roles(signed_in):
    html = signed_in.get("/instances/new/").content.decode()
    start = html[html.index('data-template-group="start"'): html.index('data-template-group="roles"')]
    roles = html[html.index('data-template-group="roles"'):]
    start_names = re.findall(r'data-template="([^"]+)"', start)
    role_names = re.findall(r'data-template="([^"]+)"', roles)
    assert start_names[0] == "program"  # the key-free one first
    assert {"coder", "pilot", "triage", "plan-build-qa", "research-write-check"} <= set(start_names)
    assert {"pbq-qa", "pbq-planner", "pbq-builder", "rwc-writer", "rwc-researcher", "rwc-checker"} == set(role_names)
    assert "Start here" in start and "Roles in compositions" in roles
    assert "no API key needed" in start


def test_the_create_form_has_no_edit_wording_and_the_edit_form_has(signed_in, capable, make_instance):
    created = signed_in.get("/instances/new/coder/").content.decode()
    assert "Blank: keep" not in created and 'name="env_clear"' not in created
    mine = make_instance(capable, name="with-env", env={"TOKEN": "x"})
    edit = signed_in.get(f"/instances/{mine.pk}/edit").content.decode()
    assert "Blank: keep the current ones" in edit and 'name="env_clear"' in edit


def test_a_program_brain_keeps_no_claude_settings(signed_in, capable):
    coder = AgentTemplate.objects.get(name="coder")
    page = signed_in.get("/instances/new/coder/").content.decode()
    assert "data-brain-switch" in page
    answer = signed_in.post("/instances/new/coder/", full_post(
        coder, name="prog", brain="command", decider="checks", command="/usr/bin/true",
        tools=["read_file", "run_command", "delegate"], approval_tools=["run_command"],
    ))
    assert answer.status_code == 302, answer.content.decode()[:3000]
    made = Instance.objects.get(name="prog")
    assert (made.model, made.system_prompt, made.tools, made.approval_tools) == ("", "", ["delegate"], [])
    detail = signed_in.get(f"/instances/{made.pk}/").content.decode()
    assert "read_file" not in detail and coder.model not in detail
    # The rules that hide what a program does not use.
    css = (Path(settings.BASE_DIR) / "static" / "console" / "console.css").read_text()
    assert 'option[value="command"]:checked) .form-field:is(' in css and '[data-field="system_prompt"]' in css
    assert 'option[value="checks"]:checked) .form-field[data-field="model"]' in css


def test_without_the_capability_a_program_template_asks_for_no_model(signed_in):
    page = signed_in.get("/instances/new/program/").content.decode()
    assert 'name="model"' not in page and 'name="max_tool_turns"' not in page
    assert "System prompt" not in page and "sh -c" in page  # the fixed command, as a shell takes it


def test_the_instance_page_shows_a_command_with_its_quotes(signed_in, user, make_instance):
    import shlex

    from django.utils.html import escape

    argv = ["my-agent", "--say", "two words", "it's"]
    mine = make_instance(user, name="quoted", command=argv)
    html = signed_in.get(f"/instances/{mine.pk}/").content.decode()
    assert f"<code>{escape(shlex.join(argv))}</code>" in html and "my-agent --say two words" not in html
