"""REST: an instance's webhook triggers (a ninja Router mounted by web.api_urls).

Only the instance's owner sees or changes its triggers (anyone else's id answers 404, as for
instances and runs). Every write goes through `triggers.services`. A trigger's secret is in the
answer to its creation and to a rotation, and nowhere else.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Body, Router, Status

from loops.schemas import Empty
from triggers import schemas, services
from triggers.models import Delivery, Schedule, Trigger
from web.api import owned_instance
from web.rest import ApiError, Id, route

router = Router(tags=["triggers"])

TRIGGERS = "/instances/{id:instance_id}/triggers"
TRIGGER = TRIGGERS + "/{id:trigger_id}"
DELIVERIES_SHOWN = 100
NO_BODY = Body(None)  # an optional body: absent, or an empty JSON object


def hook_url(request: HttpRequest | None, trigger: Trigger) -> str:
    """Return the address a sender posts deliveries to (absolute when there is a request to say the host)."""
    path = reverse("hook", args=[trigger.pk])
    return request.build_absolute_uri(path) if request is not None else path


def trigger_json(request: HttpRequest | None, trigger: Trigger) -> dict[str, Any]:
    return {
        "id": trigger.pk,
        "instance": trigger.instance_id,
        "name": trigger.name,
        "url": hook_url(request, trigger),
        "objective_template": trigger.objective_template,
        "events": list(trigger.events or []),
        "actions": list(trigger.actions or []),
        "max_iterations": trigger.max_iterations,
        "max_cost_usd": services.cap_usd(trigger),
        "max_per_minute": trigger.max_per_minute,
        "active": trigger.active,
        "secret_set_at": trigger.secret_set_at.isoformat(),
        "created_at": trigger.created_at.isoformat(),
    }


def secret_answer(request: HttpRequest, response: HttpResponse, trigger: Trigger, secret: str) -> dict[str, Any]:
    """The trigger with its new secret: the one answer that holds it, so never kept (nor compressed)."""
    response["Cache-Control"] = "no-store"
    return {**trigger_json(request, trigger), "secret": secret}


def delivery_json(delivery: Delivery) -> dict[str, Any]:
    return {
        "id": delivery.pk,
        "delivery_id": delivery.delivery_id,
        "event": delivery.event,
        "received_at": delivery.received_at.isoformat(),
        "outcome": delivery.outcome,
        "status": delivery.status,
        "reason": delivery.reason,
        "run": delivery.run_id,
        "headers": dict(delivery.headers or {}),
        "body_excerpt": delivery.body_excerpt,
        "body_bytes": delivery.body_bytes,
    }


def owned(request: HttpRequest, model: type[Trigger] | type[Schedule], instance_id: int, item_id: int) -> Any:
    """The caller's trigger or schedule `item_id` of instance `instance_id` (`services.owned`), or a JSON 404."""
    found = services.owned(model, request.user, item_id, instance_id=instance_id)
    if found is None:
        raise ApiError(f"{model._meta.model_name} {item_id} of instance {instance_id} not found", 404)
    return found


def listed(request: HttpRequest, model: type[Trigger] | type[Schedule], instance_id: int, shown: Any) -> Any:
    """The caller's triggers or schedules of instance `instance_id` (`services.of_instance`), each as `shown` says."""
    items = services.of_instance(model, request.user, owned_instance(request, instance_id))
    return {f"{model._meta.model_name}s": [shown(item) for item in items]}


def _trigger(request: HttpRequest, instance_id: int, trigger_id: int) -> Trigger:
    return owned(request, Trigger, instance_id, trigger_id)


@route(router.get, TRIGGERS, "triggers", schemas.Triggers, "List the instance's triggers")
def trigger_list(request: HttpRequest, instance_id: Id) -> Any:
    return listed(request, Trigger, instance_id, lambda t: trigger_json(request, t))


@route(
    router.post, TRIGGERS, "triggers", schemas.TriggerWithSecret,
    "Create a webhook trigger; the answer holds its secret, shown this once",
    status=201,
)
def trigger_create(
    request: HttpRequest, response: HttpResponse, instance_id: Id, payload: schemas.TriggerIn
) -> Any:
    instance = owned_instance(request, instance_id)
    trigger, secret = services.trigger_create(
        user=request.user, instance=instance, request=request, **payload.model_dump()
    )
    return Status(201, secret_answer(request, response, trigger, secret))


@route(router.get, TRIGGER, "trigger-detail", schemas.Trigger, "Get a trigger")
def trigger_detail(request: HttpRequest, instance_id: Id, trigger_id: Id) -> Any:
    return trigger_json(request, _trigger(request, instance_id, trigger_id))


@route(
    router.patch, TRIGGER, "trigger-detail", schemas.Trigger,
    "Change a trigger (only the fields given); active: false pauses it",
)
def trigger_change(
    request: HttpRequest, instance_id: Id, trigger_id: Id, payload: schemas.TriggerChange
) -> Any:
    trigger = _trigger(request, instance_id, trigger_id)
    trigger = services.trigger_change(
        user=request.user, trigger=trigger, changes=payload.model_dump(exclude_none=True), request=request
    )
    return trigger_json(request, trigger)


@route(router.delete, TRIGGER, "trigger-detail", schemas.Deleted, "Delete a trigger")
def trigger_delete(request: HttpRequest, instance_id: Id, trigger_id: Id) -> Any:
    return services.delete_with(services.trigger_delete, request.user, _trigger(request, instance_id, trigger_id), request=request)


@route(
    router.post, TRIGGER + "/rotate", "trigger-rotate", schemas.TriggerWithSecret,
    "Give a trigger a new secret (the old one stops working at once); the answer holds it, shown this once",
)
def trigger_rotate(
    request: HttpRequest, response: HttpResponse, instance_id: Id, trigger_id: Id, payload: Empty = NO_BODY
) -> Any:
    trigger = _trigger(request, instance_id, trigger_id)
    secret = services.trigger_rotate(user=request.user, trigger=trigger, request=request)
    return secret_answer(request, response, trigger, secret)


@route(
    router.get, TRIGGER + "/deliveries", "trigger-deliveries", schemas.Deliveries,
    f"The trigger's latest deliveries (at most {DELIVERIES_SHOWN}), accepted and refused, newest first",
)
def trigger_deliveries(request: HttpRequest, instance_id: Id, trigger_id: Id) -> Any:
    trigger = _trigger(request, instance_id, trigger_id)
    return {"deliveries": [delivery_json(d) for d in trigger.deliveries.all()[:DELIVERIES_SHOWN]]}
