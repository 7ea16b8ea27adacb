"""REST: the loop routes (a ninja Router mounted by web.api_urls). Every write goes through loops.services.

Bodies and query parameters are parsed by the schemas in `loops.schemas`, which also make
their part of /v1/openapi.json; a refusal from a service keeps its status (`Refused.status`).
"""

from __future__ import annotations

from typing import Any, Literal

from django.db.models import Prefetch
from django.http import HttpRequest
from ninja import Body, Query, Router, Status

from budgets import metering
from budgets import services as budget_services
from budgets.selectors import headroom_for_run, pool_as_json, pools_visible_to
from budgets.spending import run_spending
from instances import credentials
from instances.brains.base import BrainError, BudgetExhausted
from instances.models import Instance
from loops import compaction, decision, events, schemas, selectors, services
from loops.models import Run
from loops.policy import Check
from reviews import rollback
from web.rest import ApiError, Id, route

PAGE = 1000
COST_CALLS = 2500  # a page of 10 iterations: every call of each, at 200 tool turns per act and then some

router = Router(tags=["runs"])

INSTANCE = "/instances/{id:instance_id}"
RUN = INSTANCE + "/loop/{id:run_id}"
NO_BODY = Body(None)  # an optional body: absent, or a JSON object of the schema's fields


def owned_instance(request: HttpRequest, instance_id: int) -> Instance:
    """The caller's instance `instance_id` (`selectors.instance_for`), or a JSON 404: every API surface's lookup."""
    found = selectors.instance_for(request.user, instance_id)
    if found is None:
        raise ApiError(f"instance {instance_id} not found", 404)
    return found


def _run(request: HttpRequest, instance_id: int, run_id: int) -> Run:
    found = Run.objects.filter(owner=request.user, instance_id=instance_id, pk=run_id).first()
    if found is None:
        raise ApiError(f"run {run_id} of instance {instance_id} not found", 404)
    return found


def _changed(request: HttpRequest, instance_id: int, run_id: int, change: Any, **options: Any) -> Any:
    """Apply a service's change to the caller's run; answer 202 with the run, or its refusal."""
    run = _run(request, instance_id, run_id)
    run = change(run=run, user=request.user, request=request, **options)
    return Status(202, selectors.run_json(run))


def _usd(value: Any) -> str | None:
    return None if value is None else str(value)


@route(
    router.get, INSTANCE + "/loop", "loop", schemas.Runs,
    "List the instance's runs (newest first, at most 200)",
)
def loop_list(
    request: HttpRequest,
    instance_id: Id,
    origin: Literal[tuple(Run.Origin.values)] | None = Query(  # type: ignore[valid-type]
        None, description="only the runs that started this way"
    ),
) -> Any:
    instance = owned_instance(request, instance_id)
    runs = Run.objects.filter(instance=instance, owner=request.user)
    if origin:
        runs = runs.filter(origin=origin)
    runs = (
        runs
        .select_related("continuation")
        .prefetch_related(Prefetch("children", queryset=Run.objects.only("pk", "parent_id")))
        .order_by("-id")[:200]
    )
    return {"runs": [selectors.run_json(r) for r in runs]}


@route(router.post, INSTANCE + "/loop", "loop", schemas.Run, "Start a run", status=201)
def loop_start(request: HttpRequest, instance_id: Id, payload: schemas.RunIn) -> Any:
    instance = owned_instance(request, instance_id)
    run = services.run_start(
        instance=instance,
        user=request.user,
        objective=payload.objective,
        max_iterations=payload.max_iterations,
        max_cost_usd=_usd(payload.max_cost_usd),
        max_minutes=payload.max_minutes,
        request=request,
    )
    return Status(201, selectors.run_json(run))


@route(router.get, RUN, "run-detail", schemas.RunDetail, "Get a run")
def run_detail(request: HttpRequest, instance_id: Id, run_id: Id) -> Any:
    run = _run(request, instance_id, run_id)
    return {**selectors.run_json(run), "budget": headroom_for_run(run).as_json()}


@route(router.post, RUN + "/cancel", "run-cancel", schemas.Run, "Stop a run", status=202)
def run_cancel(request: HttpRequest, instance_id: Id, run_id: Id, payload: schemas.Empty = NO_BODY) -> Any:
    return _changed(request, instance_id, run_id, services.run_cancel)


@route(
    router.post, RUN + "/interject", "run-interject", schemas.Interjected,
    "Queue a message for the next iteration (answers a waiting run)",
    status=202,
)
def run_interject(request: HttpRequest, instance_id: Id, run_id: Id, payload: schemas.Interjection) -> Any:
    run = _run(request, instance_id, run_id)
    interjection = services.run_interject(
        run=run, user=request.user, text=payload.message or "", approve=payload.approve, request=request
    )
    run.refresh_from_db()
    return Status(202, {"interjection": interjection.pk, "run": selectors.run_json(run)})


@route(
    router.post, RUN + "/resume", "run-resume", schemas.Run,
    "Resume a budget_exhausted run (optionally raising its cap first)",
    status=202,
)
def run_resume(request: HttpRequest, instance_id: Id, run_id: Id, payload: schemas.ResumeIn = NO_BODY) -> Any:
    return _changed(
        request, instance_id, run_id, services.run_resume, max_cost_usd=_usd(payload.max_cost_usd if payload else None)
    )


@route(
    router.post, RUN + "/continue", "run-continue", schemas.Run, status=201,
    summary=(
        "Continue any finished run as a new run with its history, in its workspace, with your message (for a "
        "verified done the message is required: it is the follow-up's objective); the old run is not changed. "
        "A budget_exhausted run is resumed instead"
    ),
)
def run_continue(
    request: HttpRequest, instance_id: Id, run_id: Id, payload: schemas.RunContinueIn = NO_BODY
) -> Any:
    run = _run(request, instance_id, run_id)
    payload = payload or schemas.RunContinueIn()
    new = services.run_continue(
        run=run,
        user=request.user,
        max_iterations=payload.max_iterations,
        max_cost_usd=_usd(payload.max_cost_usd),
        max_minutes=payload.max_minutes,
        message=payload.message,
        request=request,
    )
    return Status(201, selectors.run_json(new))


@route(router.post, RUN + "/close", "run-close", schemas.Run, "Close a waiting run as escalated", status=202)
def run_close(request: HttpRequest, instance_id: Id, run_id: Id, payload: schemas.Empty = NO_BODY) -> Any:
    return _changed(request, instance_id, run_id, services.run_close)


@route(
    router.post, INSTANCE + "/loop-decide", "loop-decide", schemas.Decision, refusals=(502,),
    summary=(
        "Run the instance's decider once on a snapshot (no run or event is touched; an llm decider's call is "
        "metered to your own pool)"
    ),
)
def loop_decide(request: HttpRequest, instance_id: Id, payload: schemas.DecideIn) -> Any:
    """Run the instance's decider once on a given snapshot; no run or event is touched.

    An `llm` decider's call is metered like any other and charged to the caller's own pool.
    """
    instance = owned_instance(request, instance_id)
    checks = [Check(c.name, c.required, c.passed, c.output) for c in payload.checks or []]
    recent = payload.recent_instructions or []
    usage = None
    if instance.decider == instance.Decider.LLM:
        from instances.brains.anthropic.decider import decide  # lazy: the SDK loads for an llm decider only

        snapshot = payload.model_dump(exclude_none=True)
        snapshot["history"] = compaction.for_prompt(payload.history or [])
        snapshot.setdefault("iteration", 1)
        snapshot.setdefault("max_iterations", instance.max_iterations)
        snapshot["checks"] = [c.__dict__ for c in checks]
        try:
            credentials.ensure_usable(instance)
            # Charged to the caller's own pool: there is no run, but the call is still metered.
            meter = metering.for_pool(budget_services.user_pool(request.user))
            answer, used = decide(instance, snapshot, meter=meter)
        except ValueError as exc:  # no usable key: the instance is not ready, the request is fine
            raise ApiError(str(exc), 409) from None
        except BudgetExhausted as exc:
            raise ApiError(f"budget_exhausted: {exc.detail}", 402) from None
        except BrainError as exc:
            raise ApiError(f"{exc.outcome}: {exc.detail}", 502) from None
        found = decision.parse(answer, recent_instructions=recent)
        usage = used.as_json()
    else:
        found = decision.from_checks(
            checks, act_ok=payload.act_ok is not False, act_detail=payload.act_detail or ""
        )
    return {
        "verdict": found.verdict,
        "reason": found.reason,
        "next_instruction": found.next_instruction,
        "decider": instance.decider,
        "usage": usage,
    }


@route(router.get, "/pools", "pools", schemas.Pools, "Your budget pools: limit, spent, reserved, period")
def pools(request: HttpRequest) -> Any:
    return {"pools": [pool_as_json(p) for p in pools_visible_to(request.user)]}


@route(
    router.get, RUN + "/costs", "run-costs", schemas.Costs,
    summary=(
        "Where the run's money went: per iteration (newest first, 10 a page) and per call (model, tokens, reserved, "
        "settled, overdraft and its cause, the pools that paid), and its pools' headroom"
    ),
)
def run_costs(
    request: HttpRequest,
    instance_id: Id,
    run_id: Id,
    before: int | None = Query(
        None, ge=1, le=2**31, description="iterations below this one (the previous page's `earlier`)"
    ),
) -> Any:
    """Where the run's money went: per iteration (newest first) and per call, and its pools' headroom."""
    run = _run(request, instance_id, run_id)
    chain = headroom_for_run(run)
    found = run_spending(run.pk, before=before, chain=chain, calls=COST_CALLS)
    return {
        "run": run.pk,
        **selectors.run_json(run, ("spent_usd", "spent_micros")),
        "iterations": [it.as_json() for it in found.iterations],
        "earlier": found.earlier,
        "budget": chain.as_json(),
    }


@route(router.get, RUN + "/events", "run-events", schemas.Events, "Events after a seq (at most 1000 a page)")
def run_events(
    request: HttpRequest,
    instance_id: Id,
    run_id: Id,
    after: int = Query(0, ge=0, le=2**63 - 1, description="the last seq you have"),
) -> Any:
    run = _run(request, instance_id, run_id)
    found = events.after(run, after, limit=PAGE)
    last = found[-1].seq if found else after
    return {"events": [e.as_json() for e in found], "last_seq": last, "more": last < run.last_seq}


@route(
    router.get, RUN + "/rollback", "run-rollback", schemas.RollbackPoints,
    summary=(
        "The states the run's workspace can be rolled back to: the last verified state, before the run, as each "
        "iteration left it, and as each earlier rollback found it"
    ),
)
def run_rollback_points(request: HttpRequest, instance_id: Id, run_id: Id) -> Any:
    return rollback.listing(_run(request, instance_id, run_id))


@route(
    router.post, RUN + "/rollback", "run-rollback", schemas.RolledBack,
    summary=(
        "Roll the run's workspace back to one of its points (refused with 409 while a run on that workspace is "
        "live). The workspace as it is is snapshot first: `undo` names the point that returns to it. What the "
        "snapshots do not keep is left as it is and named in `kept`; `dry_run` changes nothing"
    ),
)
def run_rollback(request: HttpRequest, instance_id: Id, run_id: Id, payload: schemas.RollbackIn) -> Any:
    run = _run(request, instance_id, run_id)
    if payload.dry_run:
        return rollback.plan(run=run, to=payload.to).as_json()
    return rollback.rollback(run=run, user=request.user, to=payload.to, via="api", request=request).as_json()
