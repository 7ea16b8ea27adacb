"""The only writers of runs: start, cancel, interject, resume, close.

The API, the console and the CLI call these; none of them touches a run directly.
Each change is one short transaction; events are appended inside it and viewers
are woken after it commits.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops import events, tasks
from loops.models import Interjection, Run
from reviews import audit

INTERJECTION_MAX_CHARS = 8000


class Refused(Exception):
    """A request the service will not carry out; `message` says what to do instead."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _usd_to_micros(value: Any, field: str) -> int:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise Refused(f"{field} must be a number of US dollars, like 2.50; got {value!r}") from None
    if not amount.is_finite() or amount <= 0:
        raise Refused(f"{field} must be more than 0 dollars; got {value}")
    return int(amount * 1_000_000)


def run_start(
    *,
    instance,
    user,
    objective: str,
    max_iterations: int | None = None,
    max_cost_usd: Any = None,
    max_minutes: int | None = None,
    via: str = "api",
    request=None,
) -> Run:
    """Create a run of `instance` toward `objective` and schedule its first iteration."""
    objective = (objective or "").strip()
    if not objective:
        raise Refused("objective is empty: say what the agent should achieve")
    if len(objective) > instance.objective_max_chars:
        raise Refused(
            f"objective is {len(objective):,} characters; this instance accepts at most "
            f"{instance.objective_max_chars:,}. Shorten it or raise the instance's objective cap."
        )
    if max_iterations is None:
        max_iterations = instance.max_iterations
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int) or not 1 <= max_iterations <= 10_000:
        raise Refused(f"max_iterations must be a whole number from 1 to 10000; got {max_iterations!r}")
    max_cost = None if max_cost_usd in (None, "") else _usd_to_micros(max_cost_usd, "max_cost_usd")
    deadline = None
    if max_minutes is not None:
        if isinstance(max_minutes, bool) or not isinstance(max_minutes, int) or max_minutes < 1:
            raise Refused(f"max_minutes must be a whole number of minutes, at least 1; got {max_minutes!r}")
        deadline = timezone.now() + timedelta(minutes=max_minutes)
    from instances import credentials

    try:
        credentials.ensure_usable(instance)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    with transaction.atomic():
        run = Run.objects.create(
            instance=instance,
            owner=user,
            objective=objective,
            max_iterations=max_iterations,
            max_cost_micros=max_cost,
            deadline=deadline,
            next_instruction=objective,
            lease_expires_at=tasks.pickup_deadline(),
        )
        from budgets import ledger
        from budgets import services as budget_services

        try:
            budget_services.open_run_pools(run)
        except ledger.InvalidBudget as exc:
            raise Refused(str(exc)) from None
        events.append(
            run.pk,
            "run.started",
            {
                "objective": objective[:2000],
                "instance": instance.pk,
                "max_iterations": max_iterations,
                "max_cost_usd": None if max_cost is None else f"{max_cost / 1_000_000:.2f}",
                "by": user.get_username(),
                "via": via,
            },
        )
        audit.record(
            user=user, action="run.start", run=run, request=request, via=via,
            detail={"objective": objective[:500], "max_iterations": max_iterations, "max_cost_usd": max_cost_usd},
        )
        tasks.schedule(run.pk, run.next_iteration)
    return run


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def run_cancel(*, run: Run, user, via: str = "api", request=None) -> Run:
    """Stop the run: at once when no driver holds it, else at the driver's next check (<1 s)."""
    with transaction.atomic():
        run = _locked(run)
        if run.status == Run.Status.FINISHED:
            raise Refused(f"run {run.pk} already finished ({run.outcome}); there is nothing to stop", 409)
        now = timezone.now()
        if run.cancel_requested_at is None:
            Run.objects.filter(pk=run.pk).update(cancel_requested_at=now)
            events.append(run.pk, "run.stop_requested", {"by": user.get_username(), "via": via})
            audit.record(user=user, action="run.stop", run=run, request=request, via=via, detail={"status": run.status})
        if run.lease_token is None:
            # Nobody is driving it (queued or waiting): finish it here.
            Run.objects.filter(pk=run.pk, lease_token__isnull=True).update(
                status=Run.Status.FINISHED,
                outcome=Run.Outcome.CANCELLED,
                outcome_detail=f"stopped by {user.get_username()} before it was picked up"
                if run.status == Run.Status.QUEUED
                else f"stopped by {user.get_username()} while it waited for a person",
                finished_at=now,
                lease_expires_at=None,
            )
            from loops.runner import charge_abandoned

            charge_abandoned(run)
            run.refresh_from_db()
            from loops.runner import after_finish, finished_data

            events.append(run.pk, "run.finished", finished_data(run))
            after_finish(run.pk)
    run.refresh_from_db()
    return run


def run_interject(
    *, run: Run, user, text: str, approve: bool | None = None, via: str = "api", request=None
) -> Interjection:
    """Queue a message for the next iteration; on a waiting run it is the answer that resumes it.

    `approve` answers a run parked on tool calls that need a person: True runs them at
    the start of the next act, False tells the agent they were refused (and why: `text`).
    """
    text = (text or "").strip()
    if not text and approve is not None:
        text = "Approved." if approve else "Refused."
    if not text:
        raise Refused("the message is empty")
    if len(text) > INTERJECTION_MAX_CHARS:
        raise Refused(f"the message is {len(text):,} characters; at most {INTERJECTION_MAX_CHARS:,} are accepted")
    with transaction.atomic():
        run = _locked(run)
        if run.status == Run.Status.FINISHED:
            raise Refused(
                f"run {run.pk} already finished ({run.outcome}); start a new run to continue the work", 409
            )
        if run.cancel_requested_at is not None:
            raise Refused(f"run {run.pk} is being stopped; the message would never be read", 409)
        history = dict(run.history or {})
        pending = history.pop("pending_approval", None)
        if approve is not None:
            if run.status != Run.Status.WAITING or not pending:
                raise Refused(f"run {run.pk} has no tool call waiting for approval", 409)
            calls = ", ".join(str(c.get("name")) for c in pending)
            if approve:
                history["approved_calls"] = [{"name": c.get("name"), "input": c.get("input")} for c in pending]
                text = f"{text}\n(The person approved: {calls}; they run first in this act.)"
            else:
                text = f"{text}\n(The person refused: {calls}. Do not try them again; find another way.)"
            Run.objects.filter(pk=run.pk).update(history=history)
        interjection = Interjection.objects.create(run=run, author=user, text=text)
        action = "run.answer" if run.status == Run.Status.WAITING else "run.interject"
        audit.record(
            user=user, action=action, run=run, request=request, via=via,
            detail={"text": text[:500], "approve": approve},
        )
        events.append(
            run.pk,
            "interjection.queued",
            {"id": interjection.pk, "text": text[:2000], "by": user.get_username(), "via": via},
        )
        if run.status == Run.Status.WAITING:
            _reschedule(run, "run.resumed", {"by": user.get_username(), "via": via, "reason": "answered"})
    return interjection


def run_resume(*, run: Run, user, via: str = "api", request=None, max_cost_usd: Any = None) -> Run:
    """Continue a run that ran out of budget, from its next iteration, once there is headroom.

    `max_cost_usd` first raises the run's own cap ("raise the cap and resume" as one action).
    """
    new_cap = None if max_cost_usd in (None, "") else _usd_to_micros(max_cost_usd, "max_cost_usd")
    with transaction.atomic():
        run = _locked(run)
        if run.status != Run.Status.FINISHED or run.outcome != Run.Outcome.BUDGET_EXHAUSTED:
            raise Refused(
                f"only a run that ended budget_exhausted can be resumed; run {run.pk} is "
                f"{run.outcome or run.status}",
                409,
            )
        if run.next_iteration > run.max_iterations:
            raise Refused(f"run {run.pk} has used all {run.max_iterations} iterations", 409)
        if new_cap is not None:
            from budgets import ledger
            from budgets import services as budget_services

            if run.max_cost_micros is not None and new_cap <= run.max_cost_micros:
                raise Refused(
                    f"max_cost_usd must be above the run's current cap of ${run.max_cost_micros / 1_000_000:.2f}"
                )
            try:
                budget_services.run_set_cap(run, new_cap, user)
            except ledger.InvalidBudget as exc:
                raise Refused(str(exc)) from None
            Run.objects.filter(pk=run.pk).update(max_cost_micros=new_cap)
        Run.objects.filter(pk=run.pk).update(outcome="", outcome_detail="", verified=None, finished_at=None)
        audit.record(user=user, action="run.resume", run=run, request=request, via=via, detail={})
        _reschedule(run, "run.resumed", {"by": user.get_username(), "via": via, "reason": "budget"})
    run.refresh_from_db()
    return run


def run_close(*, run: Run, user, via: str = "api", request=None) -> Run:
    """Close a waiting (escalated) run as `escalated` instead of answering it."""
    with transaction.atomic():
        run = _locked(run)
        if run.status != Run.Status.WAITING:
            raise Refused(f"only a waiting run can be closed; run {run.pk} is {run.status}", 409)
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.FINISHED,
            outcome=Run.Outcome.ESCALATED,
            outcome_detail=f"{run.outcome_detail}\n(closed by {user.get_username()} without an answer)".strip(),
            finished_at=timezone.now(),
        )
        run.refresh_from_db()
        from loops.runner import after_finish, finished_data

        events.append(run.pk, "run.finished", finished_data(run))
        audit.record(user=user, action="run.close", run=run, request=request, via=via, detail={})
        after_finish(run.pk)
    return run


def _reschedule(run: Run, kind: str, data: dict[str, Any]) -> None:
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.QUEUED, lease_token=None, lease_holder="", lease_expires_at=tasks.pickup_deadline(), attempt=0
    )
    events.append(run.pk, kind, data)
    tasks.schedule(run.pk, run.next_iteration)


