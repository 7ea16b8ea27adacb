"""REST: create and list instances."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from instances.models import Instance
from loops.auth import BadRequest, api_view, error, json_body

FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "brain": (str,),
    "command": (list,),
    "env": (dict,),
    "workspace": (str,),
    "checks": (list,),
    "decider": (str,),
    "max_iterations": (int,),
    "objective_max_chars": (int,),
    "act_timeout_seconds": (int,),
    "template": (str,),
    "model": (str,),
    "system_prompt": (str,),
    "credential_id": (int,),
    "base_url": (str,),
    "tools": (list,),
    "command_allow": (list,),
    "command_deny": (list,),
    "approval_tools": (list,),
    "max_tool_turns": (int,),
    "max_output_tokens": (int,),
    "tool_timeout_seconds": (int,),
}


def instance_json(instance: Instance) -> dict[str, Any]:
    from instances import credentials

    return {
        "id": instance.pk,
        "name": instance.name,
        "brain": instance.brain,
        "command": instance.command,
        "env": instance.env,
        "workspace": str(instance.workspace_path()),
        "checks": instance.checks,
        "decider": instance.decider,
        "max_iterations": instance.max_iterations,
        "objective_max_chars": instance.objective_max_chars,
        "act_timeout_seconds": instance.act_timeout_seconds,
        "template": instance.template.name if instance.template_id else None,
        "model": instance.model,
        "system_prompt": instance.system_prompt,
        "key_source": credentials.describe_source(instance),
        "base_url": instance.base_url,
        "tools": instance.tools,
        "command_allow": instance.command_allow,
        "command_deny": instance.command_deny,
        "approval_tools": instance.approval_tools,
        "max_tool_turns": instance.max_tool_turns,
        "max_output_tokens": instance.max_output_tokens,
        "created_at": instance.created_at.isoformat(),
    }


def _argv(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise BadRequest(f"{field} must be a non-empty list of strings (an argv), like [\"ruff\", \"check\", \".\"]")
    return value


def _bounded(data: dict, field: str, low: int, high: int) -> None:
    if field in data and data[field] is not None and not low <= data[field] <= high:
        raise BadRequest(f"{field} must be between {low} and {high}; got {data[field]}")


def _strings(data: dict, field: str) -> None:
    if field in data and not all(isinstance(v, str) and v for v in data[field]):
        raise BadRequest(f"{field} must be a list of non-empty strings")


def validate(data: dict[str, Any], *, from_template: bool = False) -> dict[str, Any]:
    """Check an instance's fields; return the cleaned values."""
    clean = {k: v for k, v in data.items() if v is not None}
    name = clean.get("name", "")
    if not name.strip() or len(name) > 100:
        raise BadRequest("name must be 1 to 100 characters")
    for field in ("tools", "command_allow", "command_deny", "approval_tools"):
        _strings(clean, field)
    for field in ("tools", "approval_tools"):
        if field in clean:
            from instances.tools import check_names

            try:
                check_names(clean[field])
            except ValueError as exc:
                raise BadRequest(f"{field}: {exc}") from None
    if "base_url" in clean and not clean["base_url"].startswith(("http://", "https://")):
        raise BadRequest("base_url must start with http:// or https://")
    _bounded(clean, "max_tool_turns", 1, 200)
    _bounded(clean, "max_output_tokens", 1, 1_000_000)
    _bounded(clean, "tool_timeout_seconds", 1, 3600)
    if from_template:
        for field in ("brain", "decider"):
            choices = Instance.Brain.values if field == "brain" else Instance.Decider.values
            if field in clean and clean[field] not in choices:
                raise BadRequest(f"{field} must be one of {', '.join(choices)}; got {clean[field]!r}")
        _bounded(clean, "max_iterations", 1, 10_000)
        _bounded(clean, "objective_max_chars", 1, 1_000_000)
        return clean
    brain = clean.setdefault("brain", Instance.Brain.COMMAND)
    if brain not in Instance.Brain.values:
        raise BadRequest(f"brain must be one of {', '.join(Instance.Brain.values)}; got {brain!r}")
    if brain == Instance.Brain.COMMAND:
        _argv(clean.get("command"), "command")
    decider = clean.setdefault("decider", Instance.Decider.CHECKS)
    if decider not in Instance.Decider.values:
        raise BadRequest(f"decider must be one of {', '.join(Instance.Decider.values)}; got {decider!r}")
    env = clean.get("env", {})
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()):
        raise BadRequest("env must map variable names to string values")
    checks = clean.get("checks", [])
    seen = set()
    for i, check in enumerate(checks):
        if not isinstance(check, dict):
            raise BadRequest(f"checks[{i}] must be an object {{name, command, required}}")
        unknown = set(check) - {"name", "command", "required", "timeout"}
        if unknown:
            raise BadRequest(f"checks[{i}] has unknown field(s): {', '.join(sorted(unknown))}")
        if not isinstance(check.get("name"), str) or not check["name"].strip():
            raise BadRequest(f"checks[{i}].name must be a non-empty string")
        if check["name"] in seen:
            raise BadRequest(f"checks[{i}].name {check['name']!r} is used twice")
        seen.add(check["name"])
        _argv(check.get("command"), f"checks[{i}].command")
        if not isinstance(check.get("required", True), bool):
            raise BadRequest(f"checks[{i}].required must be true or false")
        timeout = check.get("timeout", 300)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
            raise BadRequest(f"checks[{i}].timeout must be 1 to 3600 seconds")
    _bounded(clean, "max_iterations", 1, 10_000)
    _bounded(clean, "objective_max_chars", 1, 1_000_000)
    _bounded(clean, "act_timeout_seconds", 1, 24 * 3600)
    return clean


@api_view(("GET", "POST"))
def instances(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        found = Instance.objects.filter(owner=request.user).order_by("id")
        return JsonResponse({"instances": [instance_json(i) for i in found]})
    from instances.models import Credential
    from instances.templates_loader import TemplateError, create_instance

    try:
        raw = json_body(request, FIELDS, required=("name",))
        template = raw.pop("template", None)
        data = validate(raw, from_template=template is not None)
        if template is not None:
            name = data.pop("name")
            instance = create_instance(owner=request.user, template=template, name=name, overrides=data)
        else:
            credential_id = data.pop("credential_id", None)
            if credential_id is not None and not Credential.objects.filter(pk=credential_id, owner=request.user).exists():
                raise BadRequest(f"credential {credential_id} is not one of yours; list yours with GET /v1/credentials")
            instance = Instance.objects.create(owner=request.user, credential_id=credential_id, **data)
    except BadRequest as exc:
        return error(exc.message)
    except TemplateError as exc:
        return error(str(exc))
    return JsonResponse(instance_json(instance), status=201)


def credential_json(credential) -> dict[str, Any]:
    return {"id": credential.pk, "label": credential.label, "last4": credential.last4,
            "created_at": credential.created_at.isoformat()}


@api_view(("GET", "POST"))
def credentials(request: HttpRequest) -> JsonResponse:
    """Store an Anthropic key (write-only: only its last four characters are ever shown)."""
    from instances.models import Credential

    if request.method == "GET":
        found = Credential.objects.filter(owner=request.user).order_by("id")
        return JsonResponse({"credentials": [credential_json(c) for c in found]})
    try:
        data = json_body(request, {"label": (str,), "secret": (str,)}, required=("label", "secret"))
        if len(data["label"]) > 100:
            raise BadRequest("label must be at most 100 characters")
        from reviews import audit

        with transaction.atomic():
            credential = Credential.create_for(request.user, label=data["label"], secret=data["secret"])
            audit.record(
                user=request.user, action="credential.add", request=request, via="api",
                detail={"credential": credential.pk, "label": credential.label, "last4": credential.last4},
            )
    except BadRequest as exc:
        return error(exc.message)
    except ValueError as exc:
        return error(str(exc))
    return JsonResponse(credential_json(credential), status=201)


@api_view(("DELETE",))
def credential_detail(request: HttpRequest, credential_id: int) -> JsonResponse:
    from instances.models import Credential
    from reviews import audit

    with transaction.atomic():
        deleted, _ = Credential.objects.filter(owner=request.user, pk=credential_id).delete()
        if not deleted:
            return error(f"credential {credential_id} not found", 404)
        audit.record(user=request.user, action="credential.remove", request=request, via="api",
                     detail={"credential": credential_id})
    return JsonResponse({"deleted": credential_id})


@api_view(("GET",))
def instance_detail(request: HttpRequest, instance_id: int) -> JsonResponse:
    instance = Instance.objects.filter(owner=request.user, pk=instance_id).first()
    if instance is None:
        return error(f"instance {instance_id} not found", 404)
    return JsonResponse(instance_json(instance))
