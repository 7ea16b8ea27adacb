"""Agent templates as data: loaded by migration and `loadtemplates`, instances made from them."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from instances.models import AgentTemplate, Credential, Instance
from instances.templates_loader import TEMPLATES_DIR, TemplateError, create_instance, read_templates

pytestmark = pytest.mark.django_db


def test_the_shipped_templates_are_loaded_by_migration():
    names = set(AgentTemplate.objects.values_list("name", flat=True))
    assert {"coder", "pilot", "triage"} <= names
    coder, pilot, triage = (AgentTemplate.objects.get(name=n) for n in ("coder", "pilot", "triage"))
    assert coder.brain == pilot.brain == triage.brain == "anthropic"
    assert {"read_file", "write_file", "run_command"} <= set(coder.tools)
    assert coder.decider == "llm" and coder.checks and coder.checks[0]["required"] is True
    assert pilot.max_iterations > coder.max_iterations and pilot.tools == coder.tools
    assert "run_command" not in triage.tools and triage.decider == "llm" and triage.checks == []


def test_every_template_file_is_valid():
    assert [t["name"] for t in read_templates()] == sorted(p.stem for p in TEMPLATES_DIR.glob("*.json"))


def test_loadtemplates_adds_a_template_from_a_new_data_file(tmp_path):
    (tmp_path / "reviewer.json").write_text(
        json.dumps(
            {
                "name": "reviewer",
                "description": "Reads a change and writes a review.",
                "brain": "anthropic",
                "system_prompt": "You review code.",
                "tools": ["read_file", "search_files", "write_file"],
                "decider": "llm",
                "max_iterations": 3,
            }
        )
    )
    out = StringIO()
    call_command("loadtemplates", str(tmp_path), stdout=out)
    assert "created template reviewer" in out.getvalue()
    reviewer = AgentTemplate.objects.get(name="reviewer")
    assert reviewer.tools == ["read_file", "search_files", "write_file"] and reviewer.source == "reviewer.json"
    call_command("loadtemplates", str(tmp_path), stdout=out)
    assert "updated template reviewer" in out.getvalue()
    assert AgentTemplate.objects.filter(name="reviewer").count() == 1


def test_loadtemplates_upserts_the_shipped_files():
    AgentTemplate.objects.filter(name="coder").update(max_iterations=999)
    call_command("loadtemplates", stdout=StringIO())
    assert AgentTemplate.objects.get(name="coder").max_iterations == 10


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"name": "x", "description": "", "brain": "anthropic", "tools": ["format_disk"]}, "unknown tool"),
        ({"name": "x", "description": "", "brain": "telepathy"}, "brain"),
        ({"name": "x", "brain": "anthropic"}, "description"),
        ({"name": "x", "description": "", "brain": "anthropic", "max_iterations": 0}, "max_iterations"),
        ({"name": "x", "description": "", "brain": "command"}, "needs a command"),
        ({"name": "x", "description": "", "brain": "anthropic", "colour": "red"}, "colour"),
    ],
)
def test_invalid_template_files_are_refused(tmp_path, data, problem):
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CommandError, match=problem):
        call_command("loadtemplates", str(tmp_path), stdout=StringIO())


def test_an_instance_from_a_template_takes_its_fields_and_overrides(user, tmp_path):
    key = Credential.create_for(user, label="k", secret="sk-ant-test-abcd")
    inst = create_instance(
        owner=user,
        template="coder",
        name="my coder",
        overrides={"max_iterations": 4, "workspace": str(tmp_path), "credential_id": key.pk, "approval_tools": ["run_command"]},
    )
    coder = AgentTemplate.objects.get(name="coder")
    assert inst.template == coder and inst.brain == "anthropic" and inst.decider == "llm"
    assert inst.tools == coder.tools and inst.system_prompt == coder.system_prompt and inst.model == coder.model
    assert inst.max_iterations == 4 and inst.approval_tools == ["run_command"] and inst.credential == key
    assert Instance.objects.get(pk=inst.pk).checks == coder.checks


def test_template_instances_refuse_bad_overrides(user, other_user):
    with pytest.raises(TemplateError, match="unknown template"):
        create_instance(owner=user, template="nope", name="x")
    with pytest.raises(TemplateError, match="cannot override"):
        create_instance(owner=user, template="coder", name="x", overrides={"owner": other_user})
    with pytest.raises(TemplateError, match="unknown tool"):
        create_instance(owner=user, template="coder", name="x", overrides={"tools": ["format_disk"]})
    theirs = Credential.create_for(other_user, label="theirs", secret="sk-ant-theirs-1234")
    with pytest.raises(TemplateError, match="not one of yours"):
        create_instance(owner=user, template="coder", name="x", overrides={"credential_id": theirs.pk})


@pytest.mark.parametrize("lead", ["plan-build-qa", "research-write-check"])
def test_the_shipped_compositions_are_loaded_and_every_role_is_a_shipped_template(lead):
    template = AgentTemplate.objects.get(name=lead)
    assert template.roles and template.verify_with_role in template.roles
    assert "delegate" in template.tools
    for role, name in template.roles.items():
        member = AgentTemplate.objects.get(name=name)
        assert "delegate" not in member.tools, f"{lead}'s {role} must not delegate further"
    from instances import protected

    # Its checks run the project's tests: the shared defaults protect them (it adds, never copies).
    assert "tests/" in protected.globs_for(template) or lead != "plan-build-qa"
