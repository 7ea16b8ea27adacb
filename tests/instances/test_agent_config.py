"""One agent configuration (`AgentConfig`): every place that lists its fields is held to the model.

The field lists are derived from the model where they are only names (what a template gives an
instance, what may be overridden, the API's instance JSON, the admin's capability check). Where a
field needs its own type, widget or label (the API's schemas, the template file schema, the
forms, the admin layout), the tests below fail when one misses a field the model has.
"""

import json

import pytest
from django.db import models

from instances import schemas
from instances.admin import AgentTemplateAdmin, InstanceAdmin
from instances.models import AgentConfig, AgentTemplate, Credential, Instance, McpServer
from instances.templates_loader import OVERRIDABLE, SCHEMA, create_instance
from web.auth import make_token
from web.console.instance_forms import FIXED_LABELS, InstanceForm

CONFIG = set(AgentConfig.config_fields())
SETTINGS = set(Instance.setting_fields())


def _fields(admin_class):
    return {name for _, options in admin_class.fieldsets for name in options["fields"]}


def test_the_configuration_is_what_template_and_instance_share():
    template_own = {f.name for f in AgentTemplate._meta.concrete_fields} - CONFIG
    instance_own = {f.name for f in Instance._meta.concrete_fields} - CONFIG
    assert CONFIG and template_own & instance_own == {"id", "name", "updated_at"}  # and when each was last saved
    differ = {
        name for name in CONFIG
        if AgentTemplate._meta.get_field(name).deconstruct()[1:] != Instance._meta.get_field(name).deconstruct()[1:]
    }
    assert differ == {"brain", "decider"}  # their defaults alone, kept as they were:
    assert (AgentTemplate().brain, AgentTemplate().decider) == ("anthropic", "llm")
    assert (Instance().brain, Instance().decider) == ("command", "checks")
    for name in differ:
        assert AgentTemplate._meta.get_field(name).choices == Instance._meta.get_field(name).choices


def test_the_api_takes_and_shows_every_setting():
    # The API names the credential by id and never shows it (key_source says where the key comes from).
    assert set(schemas.InstanceIn.model_fields) == SETTINGS - {"credential"} | {"name", "template", "credential_id"}
    shown = {"id", "name", "template", "key_source", "created_at", "archived_at", "protected"}
    assert set(schemas.Instance.model_fields) == SETTINGS - {"credential"} | shown
    assert OVERRIDABLE == SETTINGS | {"credential_id"}


def test_a_template_file_may_give_every_configuration_field():
    bookkeeping = {"id", "source", "updated_at"}  # set by the loader, not by a file
    assert set(SCHEMA["properties"]) == {f.name for f in AgentTemplate._meta.concrete_fields} - bookkeeping
    assert SCHEMA["properties"]["brain"]["enum"] == list(Instance.Brain.values)
    assert SCHEMA["properties"]["decider"]["enum"] == list(Instance.Decider.values)


def test_the_admin_and_the_console_offer_every_setting():
    assert _fields(InstanceAdmin) == SETTINGS | {"owner", "name", "template"}
    assert set(InstanceAdmin.CHECKED) == SETTINGS | {"template"}
    assert _fields(AgentTemplateAdmin) == {f.name for f in AgentTemplate._meta.concrete_fields} - {"id"}
    assert SETTINGS <= set(InstanceForm.base_fields)
    # What a person without run_programs sees but cannot change; env's values are never shown.
    from instances.capabilities import SAFE_OVERRIDES

    assert set(FIXED_LABELS) == SETTINGS - SAFE_OVERRIDES - {"env"}
    assert set(InstanceForm.SAFE) == SAFE_OVERRIDES - {"credential_id"}


# Values other than the defaults, valid for the API; fields not named here get one by their kind.
SHAPED = {
    "brain": "command",
    "decider": "checks",
    "tools": ["read_file"],
    "approval_tools": ["read_file"],
    "checks": [{"name": "t", "command": ["true"], "required": False, "timeout": 60}],
    "mcp_servers": ["notes"],
    "base_url": "https://models.example.com",
    "model": "claude-test-1",  # priced (the `price` fixture): a rubric has Claude judge the program's dones
    "judge_model": "claude-test-1",
    "judge_pass_threshold": 70,
    "response_schema": {"type": "object", "required": ["answer"]},
}


def _changed(field: models.Field):
    if field.name in SHAPED:
        return SHAPED[field.name]
    if field.choices:
        return next(value for value, _ in field.choices if value != field.default)
    if isinstance(field, models.BooleanField):
        return not field.default
    if isinstance(field, models.PositiveIntegerField):
        return field.default + 1
    if isinstance(field, models.JSONField):
        return ["x"] if field.default is list else {"X": "1"}
    return "changed"


@pytest.mark.django_db
def test_an_instance_from_a_template_gets_its_whole_configuration(user):
    values = {name: _changed(AgentTemplate._meta.get_field(name)) for name in CONFIG}
    template = AgentTemplate.objects.create(name="everything", description="", **values)
    made = create_instance(owner=user, template=template, name="copy")
    assert {name: getattr(made, name) for name in CONFIG} == values


@pytest.mark.django_db
def test_every_setting_goes_through_the_api_and_comes_back(client, user, settings, price):
    from django.contrib.auth.models import Permission

    settings.TETHER_ALLOW_PRIVATE_BASE_URLS = True  # no name lookup for the example host
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    McpServer.objects.create(name="notes", command=["/opt/notes"], everyone=True)
    credential = Credential.create_for(user, label="k", secret="sk-ant-api03-" + "q" * 40)
    values = {f.name: _changed(Instance._meta.get_field(f.name)) for f in Instance._meta.concrete_fields
              if f.name in SETTINGS - {"credential", "workspace"}}
    headers = {"Authorization": f"Bearer {make_token(user)}"}
    body = {"name": "all", "template": "coder", "credential_id": credential.pk, **values}
    made = client.post("/v1/instances", json.dumps(body), content_type="application/json", headers=headers)
    assert made.status_code == 201, made.content
    shown = client.get(f"/v1/instances/{made.json()['id']}", headers=headers).json()
    if values.get("brain") == "command":  # a program keeps no Claude settings (services.fit_to_brain)
        values = {**values, "system_prompt": "", "tools": [], "approval_tools": []}
        if values.get("decider") != "llm" and not values.get("judge_rubric"):  # a judge uses the model too
            values["model"] = ""
    assert {name: shown[name] for name in values} == values
    stored = Instance.objects.get(pk=shown["id"])
    assert {name: getattr(stored, name) for name in values} == values and stored.credential == credential
