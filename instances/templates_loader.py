"""Agent templates as data: read `instances/agent_templates/*.json`, upsert `AgentTemplate` rows,
and build instances from a template plus overrides.

Writes to the database (templates, instances); reads template files. A new template is a
new data file — no code. Each file is one JSON object validated against `SCHEMA`:
`name` (a slug), `description`, `brain` ("anthropic" or "command"), and optionally any other
field of an agent's configuration (`instances.models.AgentConfig`: `model`, `system_prompt`,
`tools`, `decider`, `checks` ([{name, command: [argv], required}]), `command`, the guardrails
and bounds, `protected_paths` — workspace-relative globs of the files that grade the agent —
`mcp_servers`, names of MCP servers an operator registered, and the grading of a done:
`judge_rubric`, `judge_model`, `judge_pass_threshold` and `response_schema`), and for a composition `roles`
(role -> template name, reached with `delegate(to=ROLE)`) and `verify_with_role` (its done is
verified only when that role's latest run passed). A template a composition names as a role is
shown apart from the ones to start from (`grouped`). An instance made from a template copies
its whole configuration (`AgentTemplate.instance_defaults`). `python manage.py loadtemplates`
upserts them; on a fresh (or test-flushed) database the migration `0003_load_agent_templates` and the
`ensure_templates` post_migrate receiver create the missing ones without touching edited rows.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
from django.db import connections, transaction

from audit import trail
from instances.models import AgentConfig, AgentTemplate, Credential, Instance
from instances.tools import check_names
from instances.validation import json_schema_problem
from tether import limits

TEMPLATES_DIR = Path(__file__).resolve().parent / "agent_templates"

_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_COUNT = {"type": "integer", "minimum": 1}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "description", "brain"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": f"^[a-z0-9][a-z0-9_-]{{0,{limits.TEMPLATE_NAME_MAX_CHARS - 1}}}$"},
        "description": {"type": "string"},
        "brain": {"enum": list(AgentConfig.Brain.values)},
        "model": {"type": "string"},
        "system_prompt": {"type": "string"},
        "tools": _STRINGS,
        "decider": {"enum": list(AgentConfig.Decider.values)},
        "max_iterations": {"type": "integer", "minimum": 1, "maximum": limits.MAX_ITERATIONS},
        "objective_max_chars": {"type": "integer", "minimum": 1, "maximum": limits.OBJECTIVE_MAX_CHARS},
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "command"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "command": {**_STRINGS, "minItems": 1},
                    "required": {"type": "boolean"},
                    "timeout": {"type": "number", "exclusiveMinimum": 0},
                    "evidence": {"enum": ["report", "exit code"]},
                },
            },
        },
        "command": _STRINGS,
        "command_allow": _STRINGS,
        "command_deny": _STRINGS,
        "approval_tools": _STRINGS,
        "max_tool_turns": _COUNT,
        "max_output_tokens": _COUNT,
        "tool_timeout_seconds": _COUNT,
        "act_timeout_seconds": _COUNT,
        "protected_paths": _STRINGS,
        "protect_defaults": {"type": "boolean"},
        "roles": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
        "verify_with_role": {"type": "string"},
        "mcp_servers": _STRINGS,
        "judge_rubric": {"type": "string"},
        "judge_model": {"type": "string"},
        "judge_pass_threshold": {"type": "integer", "minimum": 0, "maximum": 100},
        "response_schema": {"type": "object"},
        "rewind_on_stall": {"type": "boolean"},
    },
}


class TemplateError(ValueError):
    """A template file or an override that does not make a valid agent."""


def validate(data: Any, *, source: str = "template") -> dict[str, Any]:
    """Return `data` if it is a valid template, else raise TemplateError naming the problem."""
    try:
        jsonschema.validate(data, SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise TemplateError(f"{source}: {where}: {exc.message}") from None
    try:
        check_names(data.get("tools", []))
        check_names(data.get("approval_tools", []))
    except ValueError as exc:
        raise TemplateError(f"{source}: {exc}") from None
    if data["brain"] == "command" and not data.get("command"):
        raise TemplateError(f"{source}: a command-brain template needs a command (an argv list)")
    role = data.get("verify_with_role")
    if role and role not in (data.get("roles") or {}):
        raise TemplateError(f"{source}: verify_with_role {role!r} is not one of its roles")
    if "response_schema" in data and (why := json_schema_problem(data["response_schema"])):
        raise TemplateError(f"{source}: response_schema {why}")
    if data.get("roles") and "delegate" not in (data.get("tools") or []):
        raise TemplateError(f"{source}: a composition's agent needs the 'delegate' tool to reach its roles")
    checked: dict[str, Any] = data
    return checked


def read_templates(directory: Path = TEMPLATES_DIR) -> list[dict[str, Any]]:
    """Return every template file in `directory`, validated, in name order.

    Parsed and validated once per set of files: a flushed test database (or a second migrate)
    reads them again only when a file was added, removed or changed."""
    paths = sorted(directory.glob("*.json"))
    stamp = tuple((str(path), *_stat_key(path)) for path in paths)
    if (cached := _read_cache.get(str(directory))) is None or cached[0] != stamp:
        cached = (stamp, _read_validated(paths))
        _read_cache[str(directory)] = cached
    return copy.deepcopy(cached[1])


_read_cache: dict[str, tuple[tuple[Any, ...], list[dict[str, Any]]]] = {}


def _stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def _read_validated(paths: list[Path]) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise TemplateError(f"{path.name}: not valid JSON ({exc})") from None
        validate(data, source=path.name)
        if data["name"] in found:
            raise TemplateError(f"{path.name}: template {data['name']!r} is defined twice")
        found[data["name"]] = {**data, "source": path.name}
    return [found[name] for name in sorted(found)]


def load_templates(
    directory: Path = TEMPLATES_DIR,
    *,
    model: Any = None,
    overwrite: bool = True,
    using: str = "default",
    via: str | None = None,
) -> list[tuple[str, bool]]:
    """Upsert every template file into `model` (AgentTemplate by default); return (name, created) pairs.

    With `overwrite=False` only missing templates are created, so edits made in admin stay.
    `model` may be a migration's historical model: only fields it has are written. With `via`
    (a person ran `loadtemplates`), each template created or changed is in the audit trail.
    """
    if model is None:
        model = AgentTemplate
    known = {f.name for f in model._meta.get_fields() if getattr(f, "concrete", False)}
    templates = read_templates(directory)
    rows = model.objects.using(using)
    if not overwrite:
        # One read and one insert, not a get_or_create each: this runs after every test flush.
        present = set(rows.filter(name__in=[t["name"] for t in templates]).values_list("name", flat=True))
        missing = [t for t in templates if t["name"] not in present]
        rows.bulk_create([model(name=t["name"], **_known(t, known)) for t in missing], ignore_conflicts=True)
        return [(t["name"], t["name"] not in present) for t in templates]
    results = []
    for data in templates:
        with transaction.atomic(using=using):
            old = rows.filter(name=data["name"]).first() if via else None
            row, created = rows.update_or_create(name=data["name"], defaults=_known(data, known))
            if via:
                _audit(old, row, via)
        results.append((data["name"], created))
    return results


def _audit(old: Any, row: Any, via: str) -> None:
    found = trail.changes(trail.snapshot(old) if old else None, trail.snapshot(row))
    if old is None or found["after"]:
        action = "template.update" if old else "template.create"
        trail.record(user=None, action=action, via=via, detail={"agenttemplate": row.pk, "name": row.name, **found})


def _known(data: dict[str, Any], known: set[str]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in known and k != "name"}


def ensure_templates(sender: Any = None, *, app_config: Any = None, using: str = "default", **kwargs: Any) -> None:
    """A post_migrate receiver: create the shipped templates that are missing (a fresh or flushed database).

    Never overwrites: a template edited in admin keeps its edits until `loadtemplates` is run.
    """
    if app_config is None or app_config.label != "instances":
        return
    if AgentTemplate._meta.db_table not in connections[using].introspection.table_names():
        return  # migrated backwards past the table
    load_templates(overwrite=False, using=using)


# What an instance made from a template may set: every setting (its configuration and its own,
# see `Instance.setting_fields`), the credential also by id as the API names it.
OVERRIDABLE = frozenset({*Instance.setting_fields(), "credential_id"})


def instance_values(template: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the field values of an instance made from `template` with `overrides` applied.

    Raises TemplateError for an unknown field or a result that is not a valid agent.
    """
    overrides = dict(overrides or {})
    unknown = set(overrides) - OVERRIDABLE
    if unknown:
        raise TemplateError(f"cannot override {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(OVERRIDABLE))}")
    values = {**template.instance_defaults(), **overrides}
    try:
        check_names(values.get("tools") or [])
        check_names(values.get("approval_tools") or [])
    except ValueError as exc:
        raise TemplateError(str(exc)) from None
    return values


def grouped(templates: Any) -> tuple[list[Any], list[Any]]:
    """Return `templates` as (the ones to start from, the roles of compositions).

    A role is a template some composition names in its `roles` (`pbq-qa`, `rwc-writer`): its
    agent is started by that composition's `delegate`, not on its own. The ones to start from
    come key-free first (a program brain needs no API key), then by name.
    """
    rows = list(templates)
    role_names = {name for t in rows for name in (t.roles or {}).values()}
    roles = [t for t in rows if t.name in role_names]
    start = [t for t in rows if t.name not in role_names]
    start.sort(key=lambda t: (t.brain != AgentConfig.Brain.COMMAND, t.name))
    return start, roles


def find(template: Any) -> AgentTemplate:
    """Return `template` (an AgentTemplate or its name) as a row; raise TemplateError naming the ones there are."""
    if not isinstance(template, str):
        found: AgentTemplate = template
        return found
    row = AgentTemplate.objects.filter(name=template).first()
    if row is None:
        names = ", ".join(AgentTemplate.objects.values_list("name", flat=True)) or "none loaded"
        raise TemplateError(f"unknown template {template!r}; available: {names}")
    return row


def create_instance(*, owner: Any, template: Any, name: str, overrides: dict[str, Any] | None = None) -> Any:
    """Create and return an instance of `owner` from `template` (an AgentTemplate or its name)."""
    template = find(template)
    values = instance_values(template, overrides)
    credential = values.pop("credential", None)
    credential_id = values.pop("credential_id", None)
    if isinstance(credential, int):
        credential_id, credential = credential, None
    if credential_id is not None:
        credential = Credential.objects.filter(pk=credential_id, owner=owner).first()
        if credential is None:
            raise TemplateError(f"credential {credential_id} is not one of yours")
    elif credential is not None and credential.owner_id != owner.pk:
        raise TemplateError("that credential is not one of yours")
    return Instance.objects.create(owner=owner, name=name, template=template, credential=credential, **values)
