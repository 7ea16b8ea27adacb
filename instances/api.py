"""REST: instances and credentials (a ninja Router mounted by web.api_urls).

Bodies are parsed by `instances.schemas` (the one schema of an instance's fields, also used by
the console through `instances.validation`); every write goes through `instances.services`.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from instances import credentials, prices, protected, schemas, services, templates_loader
from instances.models import AgentTemplate, Credential, Instance
from web.rest import ApiError, Id, errors

router = Router(tags=["instances"])

FIELDS = tuple(schemas.InstanceIn.model_fields)  # what POST /v1/instances takes


# An instance's settings as the API shows them: as stored, but for its credential (a key is
# never shown; `key_source` says where the key comes from) and its workspace (shown resolved).
SHOWN = tuple(f for f in Instance.setting_fields() if f not in ("credential", "workspace"))


def instance_json(instance: Instance) -> dict[str, Any]:
    return {
        "id": instance.pk,
        "name": instance.name,
        "template": instance.template.name if instance.template_id else None,
        **{field: getattr(instance, field) for field in SHOWN},
        "workspace": str(instance.workspace_path()),
        "key_source": credentials.describe_source(instance),
        "created_at": instance.created_at.isoformat(),
        "archived_at": instance.archived_at.isoformat() if instance.archived_at else None,
        "protected": protected.globs_for(instance),
    }


def template_json(template: AgentTemplate, *, role: bool) -> dict[str, Any]:
    """A template as the API and MCP show it: its whole configuration, its composition, and whether it can be used.

    `role`: a composition names it as a role (its agent is started by `delegate`, not on its own).
    `usable`: an instance made from it as it is would be kept (every model it calls has a price).
    """
    return {
        "name": template.name,
        "description": template.description,
        "role": role,
        "roles": template.roles or {},
        "verify_with_role": template.verify_with_role or None,
        **{field: getattr(template, field) for field in AgentTemplate.config_fields()},
        "usable": prices.template_usable(template),
    }


def templates_json() -> dict[str, Any]:
    """Every template: the ones to start from first (`templates_loader.grouped`), then the roles."""
    start, roles = templates_loader.grouped(AgentTemplate.objects.order_by("name"))
    return {"templates": [template_json(t, role=False) for t in start] + [template_json(t, role=True) for t in roles]}


@router.get(
    "/templates",
    url_name="templates",
    response={200: schemas.Templates, **errors()},
    summary="List the agent templates an instance can be made from (and the roles of compositions)",
)
def template_list(request: HttpRequest) -> Any:
    return templates_json()


def credential_json(credential) -> dict[str, Any]:
    return {
        "id": credential.pk,
        "label": credential.label,
        "last4": credential.last4,
        "created_at": credential.created_at.isoformat(),
    }


@router.get(
    "/instances",
    url_name="instances",
    response={200: schemas.Instances, **errors()},
    summary="List your instances",
)
def instance_list(request: HttpRequest) -> Any:
    found = (
        Instance.objects.filter(owner=request.user).select_related("template", "credential").order_by("id")
    )
    return {"instances": [instance_json(i) for i in found]}


@router.post(
    "/instances",
    url_name="instances",
    response={201: schemas.Instance, **errors()},
    summary="Create an instance (by hand, or from a template with overrides)",
)
def instance_create(request: HttpRequest, payload: schemas.InstanceIn) -> Any:
    values = payload.model_dump(exclude_none=True)
    template = values.pop("template", None)
    instance = services.instance_create(
        user=request.user, values=values, template=template, request=request
    )
    return Status(201, instance_json(instance))


@router.get(
    "/instances/{id:instance_id}",
    url_name="instance-detail",
    response={200: schemas.Instance, **errors()},
    summary="Get an instance",
)
def instance_detail(request: HttpRequest, instance_id: Id) -> Any:
    return instance_json(_own_instance(request, instance_id))


@router.patch(
    "/instances/{id:instance_id}",
    url_name="instance-detail",
    response={200: schemas.Instance, **errors()},
    summary="Change an instance's settings (only the fields given)",
    description=(
        "Takes the fields of POST /v1/instances but `template`, none required; absent or null leaves a field "
        "as it is. Only what changes is checked against your capabilities (403: without `run_programs`, only "
        "the safe fields of a template's instance, the objective cap no higher than the template's). An "
        "archived instance may be changed (it stays archived). A run in flight picks the change up from its "
        "next iteration; its objective and caps stay as they were when it started."
    ),
)
def instance_update(request: HttpRequest, instance_id: Id, payload: schemas.InstanceChange) -> Any:
    instance = _own_instance(request, instance_id)
    instance = services.instance_update(
        instance=instance, user=request.user, values=payload.model_dump(exclude_none=True), request=request
    )
    return instance_json(instance)


@router.delete(
    "/instances/{id:instance_id}",
    url_name="instance-detail",
    response={200: schemas.Instance, **errors()},
    summary="Archive an instance (its runs and receipts stay)",
    description=(
        "Archives, as the console's Archive does: the instance leaves the fleet and starts no new run "
        "(409), and nothing is deleted. 409 while one of its runs is not finished. Archiving an archived "
        "instance changes nothing and answers 200 again. The console's Restore brings it back."
    ),
)
def instance_archive(request: HttpRequest, instance_id: Id) -> Any:
    instance = _own_instance(request, instance_id)
    instance = services.instance_archive(instance=instance, user=request.user, request=request)
    return instance_json(instance)


def _own_instance(request: HttpRequest, instance_id: int) -> Instance:
    """Return the user's instance `instance_id`; another user's or an unknown one is a 404."""
    instance = Instance.objects.filter(owner=request.user, pk=instance_id).select_related("template").first()
    if instance is None:
        raise ApiError(f"instance {instance_id} not found", 404)
    return instance


@router.get(
    "/credentials",
    url_name="credentials",
    response={200: schemas.Credentials, **errors()},
    summary="List your stored Anthropic keys (last four characters only)",
)
def credential_list(request: HttpRequest) -> Any:
    found = Credential.objects.filter(owner=request.user).order_by("id")
    return {"credentials": [credential_json(c) for c in found]}


@router.post(
    "/credentials",
    url_name="credentials",
    response={201: schemas.Credential, **errors()},
    summary="Store an Anthropic key (write-only)",
)
def credential_create(request: HttpRequest, payload: schemas.CredentialIn) -> Any:
    credential = services.credential_add(
        user=request.user, label=payload.label, secret=payload.secret, request=request
    )
    return Status(201, credential_json(credential))


@router.delete(
    "/credentials/{id:credential_id}",
    url_name="credential-detail",
    response={200: schemas.Deleted, **errors()},
    summary="Delete a stored key",
)
def credential_delete(request: HttpRequest, credential_id: Id) -> Any:
    removed = services.credential_remove(user=request.user, credential_id=credential_id, via="api", request=request)
    if removed is None:
        raise ApiError(f"credential {credential_id} not found", 404)
    return {"deleted": credential_id}
