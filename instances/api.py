"""REST: create and list instances."""

from __future__ import annotations

from typing import Any

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
}


def instance_json(instance: Instance) -> dict[str, Any]:
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
        "created_at": instance.created_at.isoformat(),
    }


def _argv(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise BadRequest(f"{field} must be a non-empty list of strings (an argv), like [\"ruff\", \"check\", \".\"]")
    return value


def _bounded(data: dict, field: str, low: int, high: int) -> None:
    if field in data and data[field] is not None and not low <= data[field] <= high:
        raise BadRequest(f"{field} must be between {low} and {high}; got {data[field]}")


def validate(data: dict[str, Any]) -> dict[str, Any]:
    """Check an instance's fields; return the cleaned values."""
    clean = {k: v for k, v in data.items() if v is not None}
    name = clean.get("name", "")
    if not name.strip() or len(name) > 100:
        raise BadRequest("name must be 1 to 100 characters")
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
    try:
        data = validate(json_body(request, FIELDS, required=("name",)))
    except BadRequest as exc:
        return error(exc.message)
    instance = Instance.objects.create(owner=request.user, **data)
    return JsonResponse(instance_json(instance), status=201)


@api_view(("GET",))
def instance_detail(request: HttpRequest, instance_id: int) -> JsonResponse:
    instance = Instance.objects.filter(owner=request.user, pk=instance_id).first()
    if instance is None:
        return error(f"instance {instance_id} not found", 404)
    return JsonResponse(instance_json(instance))
