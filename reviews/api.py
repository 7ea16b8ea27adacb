"""REST: a finished run's signed receipt and its change card (a ninja Router mounted by web.api_urls)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from loops.models import Run
from reviews import changecard, receipts
from web.rest import ApiError, Id, errors

router = Router(tags=["receipts"])


class Receipt(Schema):
    """`{"receipt": DOCUMENT, "signature": SIGNATURE}`; verify with `manage.py loop verify-receipt FILE`."""

    receipt: dict[str, Any]
    signature: Any


def _run_or_404(request: HttpRequest, instance_id: int, run_id: int) -> Run:
    """Return the caller's run `run_id` of instance `instance_id`; 404 for any other."""
    run = (
        Run.objects.select_related("instance", "instance__template", "owner")
        .filter(owner=request.user, instance_id=instance_id, pk=run_id)
        .first()
    )
    if run is None:
        raise ApiError(f"run {run_id} of instance {instance_id} not found", 404)
    return run


def _made_or_409(found: dict[str, Any] | None, why: str) -> dict[str, Any]:
    """Return what a run's end made; 409 saying `why` while it has none (the run is live)."""
    if found is None:
        raise ApiError(why, 409)
    return found


@router.get(
    "/instances/{id:instance_id}/loop/{id:run_id}/receipt",
    url_name="run-receipt",
    response={200: Receipt, **errors()},
    summary="The finished run's signed receipt (verify with `manage.py loop verify-receipt FILE`)",
)
def receipt(request: HttpRequest, instance_id: Id, run_id: Id) -> Any:
    """The run's signed receipt (409 while it is live)."""
    run = _run_or_404(request, instance_id, run_id)
    why = f"run {run_id} has not finished ({run.status}); its receipt is written when it does"
    return _made_or_409(receipts.for_run(run), why)


@router.get(
    "/instances/{id:instance_id}/loop/{id:run_id}/card",
    url_name="run-card",
    response={200: dict[str, Any], **errors()},
    summary="What the run changed, at a glance: files, tests, protected paths, checks, cost, the agent's claim",
)
def card(request: HttpRequest, instance_id: Id, run_id: Id) -> Any:
    """The run's change card (409 while it is live: it is computed from its end)."""
    run = _run_or_404(request, instance_id, run_id)
    why = f"run {run_id} is {run.status}; its change card is made when it finishes or waits"
    return _made_or_409(changecard.for_run(run), why)
