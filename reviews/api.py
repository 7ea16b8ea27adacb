"""REST: a finished run's signed receipt and its change card (a ninja Router mounted by web.api_urls)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from loops import selectors
from loops.models import Run
from reviews import changecard, receipts
from web.rest import ApiError, Id, errors

router = Router(tags=["receipts"])


class Receipt(Schema):
    """`{"receipt": DOCUMENT, "signature": SIGNATURE}`; verify with `manage.py loop verify-receipt FILE`."""

    receipt: dict[str, Any]
    signature: Any


@router.get(
    "/instances/{id:instance_id}/loop/{id:run_id}/receipt",
    url_name="run-receipt",
    response={200: Receipt, **errors()},
    summary="The finished run's signed receipt (verify with `manage.py loop verify-receipt FILE`)",
)
def receipt(request: HttpRequest, instance_id: Id, run_id: Id) -> Any:
    """The run's signed receipt (409 while it is live)."""
    run = (
        Run.objects.select_related("instance", "instance__template", "owner")
        .filter(owner=request.user, instance_id=instance_id, pk=run_id)
        .first()
    )
    if run is None:
        raise ApiError(f"run {run_id} of instance {instance_id} not found", 404)
    envelope = receipts.for_run(run)
    if envelope is None:
        raise ApiError(
            f"run {run_id} has not finished ({run.status}); its receipt is written when it does", 409
        )
    return envelope


@router.get(
    "/instances/{id:instance_id}/loop/{id:run_id}/card",
    url_name="run-card",
    response={200: dict[str, Any], **errors()},
    summary="What the run changed, at a glance: files, tests, protected paths, checks, cost, the agent's claim",
)
def card(request: HttpRequest, instance_id: Id, run_id: Id) -> Any:
    """The run's change card (409 while it is live: it is computed from its end)."""
    run = selectors.run_for(request.user, run_id)
    if run is None or run.instance_id != instance_id:
        raise ApiError(f"run {run_id} of instance {instance_id} not found", 404)
    found = changecard.for_run(run)
    if found is None:
        raise ApiError(
            f"run {run_id} is {run.status}; its change card is made when it finishes or waits", 409
        )
    return found
