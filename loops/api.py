"""REST: the loop routes. Every write goes through loops.services."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from instances.models import Instance
from loops import events, services
from loops.auth import BadRequest, api_view, error, json_body
from loops.models import Run
from loops.runner import micros_to_usd

PAGE = 1000


def run_json(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "instance": run.instance_id,
        "objective": run.objective,
        "status": run.status,
        "outcome": run.outcome or None,
        "outcome_detail": run.outcome_detail or None,
        "verified": run.verified,
        "iterations": run.iterations_done,
        "max_iterations": run.max_iterations,
        "spent_usd": micros_to_usd(run.spent_micros),
        "max_cost_usd": None if run.max_cost_micros is None else micros_to_usd(run.max_cost_micros),
        "stop_requested": run.cancel_requested_at is not None,
        "last_seq": run.last_seq,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def _instance(request: HttpRequest, instance_id: int) -> Instance | None:
    return Instance.objects.filter(owner=request.user, pk=instance_id).first()


def _run(request: HttpRequest, instance_id: int, run_id: int) -> Run | None:
    return Run.objects.filter(owner=request.user, instance_id=instance_id, pk=run_id).first()


def _not_found_run(instance_id: int, run_id: int) -> JsonResponse:
    return error(f"run {run_id} of instance {instance_id} not found", 404)


@api_view(("GET", "POST"))
def loop(request: HttpRequest, instance_id: int) -> JsonResponse:
    instance = _instance(request, instance_id)
    if instance is None:
        return error(f"instance {instance_id} not found", 404)
    if request.method == "GET":
        runs = Run.objects.filter(instance=instance, owner=request.user).order_by("-id")[:200]
        return JsonResponse({"runs": [run_json(r) for r in runs]})
    try:
        data = json_body(
            request,
            {"objective": (str,), "max_iterations": (int,), "max_cost_usd": (int, float, str), "max_minutes": (int,)},
            required=("objective",),
        )
        run = services.run_start(
            instance=instance,
            user=request.user,
            objective=data["objective"],
            max_iterations=data.get("max_iterations"),
            max_cost_usd=data.get("max_cost_usd"),
            max_minutes=data.get("max_minutes"),
            request=request,
        )
    except BadRequest as exc:
        return error(exc.message)
    except services.Refused as exc:
        return error(exc.message, exc.status)
    return JsonResponse(run_json(run), status=201)


@api_view(("GET",))
def run_detail(request: HttpRequest, instance_id: int, run_id: int) -> JsonResponse:
    run = _run(request, instance_id, run_id)
    if run is None:
        return _not_found_run(instance_id, run_id)
    from budgets.selectors import headroom_for_run

    return JsonResponse({**run_json(run), "budget": headroom_for_run(run).as_json()})


def _act(request: HttpRequest, instance_id: int, run_id: int, action: str) -> JsonResponse:
    run = _run(request, instance_id, run_id)
    if run is None:
        return _not_found_run(instance_id, run_id)
    try:
        if action == "interject":
            data = json_body(request, {"message": (str,), "approve": (bool,)})
            if not data.get("message") and data.get("approve") is None:
                raise BadRequest("missing required field(s): message")
            interjection = services.run_interject(
                run=run, user=request.user, text=data.get("message", ""), approve=data.get("approve"), request=request
            )
            run.refresh_from_db()
            return JsonResponse({"interjection": interjection.pk, "run": run_json(run)}, status=202)
        if action == "resume":
            data = json_body(request, {"max_cost_usd": (int, float, str)})
            run = services.run_resume(
                run=run, user=request.user, request=request, max_cost_usd=data.get("max_cost_usd")
            )
            return JsonResponse(run_json(run), status=202)
        json_body(request, {})
        if action == "cancel":
            run = services.run_cancel(run=run, user=request.user, request=request)
        else:
            run = services.run_close(run=run, user=request.user, request=request)
    except BadRequest as exc:
        return error(exc.message)
    except services.Refused as exc:
        return error(exc.message, exc.status)
    return JsonResponse(run_json(run), status=202)


@api_view(("POST",))
def run_cancel(request: HttpRequest, instance_id: int, run_id: int) -> JsonResponse:
    return _act(request, instance_id, run_id, "cancel")


@api_view(("POST",))
def run_interject(request: HttpRequest, instance_id: int, run_id: int) -> JsonResponse:
    return _act(request, instance_id, run_id, "interject")


@api_view(("POST",))
def run_resume(request: HttpRequest, instance_id: int, run_id: int) -> JsonResponse:
    return _act(request, instance_id, run_id, "resume")


@api_view(("POST",))
def run_close(request: HttpRequest, instance_id: int, run_id: int) -> JsonResponse:
    return _act(request, instance_id, run_id, "close")


@api_view(("POST",))
def loop_decide(request: HttpRequest, instance_id: int) -> JsonResponse:
    """Run the instance's decider once on a given snapshot; no run, event or ledger entry is touched."""
    from instances.brains.base import BrainError
    from loops import decision
    from loops.policy import Check

    instance = _instance(request, instance_id)
    if instance is None:
        return error(f"instance {instance_id} not found", 404)
    fields = {
        "objective": (str,), "response": (str,), "instruction": (str,), "act_ok": (bool,), "act_detail": (str,),
        "checks": (list,), "history": (list,), "iteration": (int,), "max_iterations": (int,),
        "recent_instructions": (list,),
    }
    try:
        snapshot = json_body(request, fields, required=("objective",))
        checks = []
        for i, c in enumerate(snapshot.get("checks") or []):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("passed"), bool):
                raise BadRequest(f"checks[{i}] must be an object with name (string) and passed (true/false)")
            checks.append(Check(c["name"], bool(c.get("required", True)), c["passed"], str(c.get("output", ""))))
        recent = [str(x) for x in snapshot.get("recent_instructions") or []]
    except BadRequest as exc:
        return error(exc.message)
    usage = None
    if instance.decider == instance.Decider.LLM:
        from instances import credentials
        from instances.brains.anthropic import decide

        try:
            credentials.ensure_usable(instance)
            snapshot.setdefault("iteration", 1)
            snapshot.setdefault("max_iterations", instance.max_iterations)
            snapshot["checks"] = [c.__dict__ for c in checks]
            answer, used = decide(instance, snapshot)
        except ValueError as exc:
            return error(str(exc))
        except BrainError as exc:
            return error(f"{exc.outcome}: {exc.detail}", 502)
        found = decision.parse(answer, recent_instructions=recent)
        usage = used.as_json()
    else:
        found = decision.from_checks(
            checks, act_ok=snapshot.get("act_ok", True), act_detail=snapshot.get("act_detail", "")
        )
    return JsonResponse(
        {"verdict": found.verdict, "reason": found.reason, "next_instruction": found.next_instruction,
         "decider": instance.decider, "usage": usage}
    )


@api_view(("GET",))
def pools(request: HttpRequest) -> JsonResponse:
    from budgets.selectors import pool_as_json, pools_visible_to

    return JsonResponse({"pools": [pool_as_json(p) for p in pools_visible_to(request.user)]})


@api_view(("GET",))
def run_events(request: HttpRequest, instance_id: int, run_id: int) -> JsonResponse:
    run = _run(request, instance_id, run_id)
    if run is None:
        return _not_found_run(instance_id, run_id)
    raw = request.GET.get("after", "0")
    try:
        after = int(raw)
        if after < 0:
            raise ValueError
    except ValueError:
        return error(f"after must be a whole number ≥ 0 (the last seq you have); got {raw!r}")
    found = events.after(run, after, limit=PAGE)
    last = found[-1].seq if found else after
    return JsonResponse(
        {"events": [e.as_json() for e in found], "last_seq": last, "more": last < run.last_seq}
    )
