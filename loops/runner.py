"""Drive one claimed run, one fenced iteration at a time.

Runs in a worker thread. Every write is fenced by the run's lease token and its
`next_iteration`, so a stale or duplicate driver changes nothing. No transaction,
row lock or (on PostgreSQL) database connection is held across the act or the
checks: an iteration is two short transactions, `_begin` and `_record`.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from budgets import ledger, pricing
from instances.brains import get_brain
from instances.brains.base import ActRequest, BrainError, Reply, Usage
from loops import checks as checks_mod
from loops import decision as decision_mod
from loops import events, policy
from loops.models import Interjection, Iteration, Run
from reviews import graders, snapshots
from reviews import services as review_services
from tether import jsonlog

log = logging.getLogger(__name__)

ACTIVE = (Run.Status.QUEUED, Run.Status.RUNNING)
EXCERPT = 2000


class LeaseLost(Exception):
    """Another driver (or the reaper) owns the run now; this driver must let go."""


@dataclass
class Lease:
    run_id: int
    token: str
    holder: str
    stop: threading.Event = field(default_factory=threading.Event)
    # False: give the database connection back before each act (many runs share a few).
    keeps_connection: bool = True
    # Shared by the process's runs that do not keep a connection: bounds their connections.
    gate: threading.BoundedSemaphore | None = None
    gate_held: bool = False


def _enter(lease: Lease) -> None:
    if lease.gate is not None and not lease.gate_held:
        lease.gate.acquire()
        lease.gate_held = True


def _leave(lease: Lease) -> None:
    if lease.gate_held:
        connection.close()
        lease.gate_held = False
        assert lease.gate is not None
        lease.gate.release()


@dataclass
class Begun:
    run: Run
    number: int
    instruction: str
    base_instruction: str
    reservation: int | None
    started_at: Any
    approved_calls: list[dict[str, Any]] = field(default_factory=list)


def lease_seconds() -> timedelta:
    return timedelta(seconds=settings.TETHER_LEASE_SECONDS)


# --- claim, hand back, finish --------------------------------------------------------


def claim(run_id: int, iteration: int, holder: str) -> Lease | None:
    """Take the run's lease for `iteration`; None when someone else has it or it moved on."""
    token = secrets.token_hex(16)
    now = timezone.now()
    with transaction.atomic():
        taken = (
            Run.objects.filter(pk=run_id, next_iteration=iteration, status__in=ACTIVE)
            .filter(Q(lease_token__isnull=True) | Q(lease_expires_at__lt=now))
            .update(
                lease_token=token,
                lease_holder=holder,
                lease_expires_at=now + lease_seconds(),
                attempt=F("attempt") + 1,
                status=Run.Status.RUNNING,
            )
        )
        if not taken:
            return None
        run = Run.objects.get(pk=run_id)
        if run.started_at is None:
            Run.objects.filter(pk=run_id).update(started_at=now)
        events.append(run_id, "run.claimed", {"iteration": iteration, "worker": holder, "attempt": run.attempt})
        lease = Lease(run_id, token, holder)
        if run.attempt > settings.TETHER_MAX_ATTEMPTS:
            charge_abandoned(run)
            detail = (
                f"iteration {iteration} was started {run.attempt - 1} times and never finished "
                f"(its worker died each time); giving up after {settings.TETHER_MAX_ATTEMPTS} attempts"
            )
            _finish(lease, Run.Outcome.CRASHED, detail)
            return None
    return lease


def charge_abandoned(run: Run) -> int:
    """Close what a dead attempt left reserved (settled at the reserved amount) and charge the run."""
    closed = ledger.close_abandoned(run)
    if closed:
        Run.objects.filter(pk=run.pk).update(spent_micros=F("spent_micros") + closed)
    return closed


def hand_back(lease: Lease) -> None:
    """Release the run to the queue at its next iteration (a slice ended)."""
    from loops import tasks

    with transaction.atomic():
        run = Run.objects.filter(pk=lease.run_id, lease_token=lease.token).first()
        if run is None:
            return
        Run.objects.filter(pk=run.pk, lease_token=lease.token).update(
            lease_token=None, lease_holder="", lease_expires_at=timezone.now() + lease_seconds(), attempt=0
        )
        tasks.schedule(run.pk, run.next_iteration)


def _finish(lease: Lease, outcome: str, detail: str, verified: bool | None = None, **extra: Any) -> None:
    """Finish the run (inside the caller's transaction), fenced by the lease."""
    now = timezone.now()
    done = Run.objects.filter(pk=lease.run_id, lease_token=lease.token).update(
        status=Run.Status.FINISHED,
        outcome=outcome,
        outcome_detail=detail,
        verified=verified,
        finished_at=now,
        lease_token=None,
        lease_holder="",
        lease_expires_at=None,
        **extra,
    )
    if not done:
        raise LeaseLost
    run = Run.objects.get(pk=lease.run_id)
    events.append(run.pk, "run.finished", finished_data(run))
    after_finish(run.pk)


def after_finish(run_id: int) -> None:
    """Once the transaction that finished the run (or parked it) commits: receipt, review, notify."""
    transaction.on_commit(lambda: review_services.on_run_finished(run_id))


def finished_data(run: Run) -> dict[str, Any]:
    return {
        "outcome": run.outcome,
        "detail": run.outcome_detail,
        "verified": run.verified,
        "iterations": run.iterations_done,
        "spent_usd": micros_to_usd(run.spent_micros),
    }


def micros_to_usd(micros: int) -> str:
    return f"{micros / 1_000_000:.6f}"


# --- one iteration ----------------------------------------------------------------------


def drive(lease: Lease, slice_seconds: float | None = None) -> None:
    """Drive the claimed run until it stops, the lease is lost, or the slice ends."""
    slice_seconds = settings.TETHER_SLICE_SECONDS if slice_seconds is None else slice_seconds
    ends = time.monotonic() + slice_seconds
    logged = jsonlog.bind(run_id=lease.run_id)  # log lines say which run (and iteration, see _begin)
    try:
        while iterate(lease):
            if time.monotonic() >= ends:
                hand_back(lease)
                return
    except LeaseLost:
        log.info("run %s: lease lost; another driver has it", lease.run_id)
    finally:
        _leave(lease)
        jsonlog.restore(logged)


def iterate(lease: Lease) -> bool:
    """Run one iteration; return True when the loop goes on under this lease."""
    begun = _begin(lease)
    if begun is None:
        return False
    run, instance = begun.run, begun.run.instance
    if begun.number == 1:
        snapshots.take(run)  # the workspace as the run found it: the review's diff starts here
    if not lease.keeps_connection and connection.vendor == "postgresql":
        _leave(lease)
        connection.close()  # the act may be long; don't sit on one of the server's connections

    request = ActRequest(
        run_id=run.pk,
        iteration=begun.number,
        objective=run.objective,
        instruction=begun.instruction,
        workspace=instance.workspace_path(),
        stop=lease.stop,
        timeout=float(instance.act_timeout_seconds),
        snapshot=list((run.history or {}).get("snapshot", [])),
        approved_calls=begun.approved_calls,
    )
    checks: list[policy.Check] = []
    decider_usage = Usage()
    try:
        reply = get_brain(instance).act(request)
    except BrainError as exc:
        reply = Reply(ok=False, text="", usage=exc.usage, detail=exc.detail)
        step: policy.Continue | policy.Stop = policy.Stop(exc.outcome, exc.detail)
        decision = decision_mod.Decision("failed", exc.detail)
        return _record(lease, begun, reply, checks, decision, step, "", decider_usage)

    if reply.stopped:
        _enter(lease)
        if not Run.objects.filter(pk=run.pk, cancel_requested_at__isnull=False).exists():
            raise LeaseLost  # stopped because this driver lost the run or is shutting down
        step = policy.Stop(Run.Outcome.CANCELLED, f"stopped by a person during the act of iteration {begun.number}")
        decision = decision_mod.Decision("failed", "stopped mid-act")
        return _record(lease, begun, reply, checks, decision, step, "", decider_usage)

    if any(call.get("needs_approval") for call in reply.tool_calls):
        # Park the run for a person before spending anything on checks or a decider.
        step = policy.Stop(Run.Outcome.ESCALATED, reply.detail or "a tool call needs a person's approval")
        decision = decision_mod.Decision("escalate", step.detail)
        return _record(lease, begun, reply, checks, decision, step, "", decider_usage)

    workspace = instance.workspace_path()
    checks = checks_mod.run_checks(list(instance.checks or []), workspace, lease.stop)
    fingerprint = checks_mod.fingerprint(workspace)
    history = run.history or {}
    recent = [*history.get("instructions", []), begun.base_instruction][-3:]
    if instance.decider == instance.Decider.LLM:
        from instances.brains.anthropic import decide  # type: ignore[import-not-found]

        try:
            answer, decider_usage = decide(instance, _decider_snapshot(run, begun, reply, checks))
            decision = decision_mod.parse(answer, recent_instructions=recent)
        except BrainError as exc:
            decider_usage = exc.usage
            step = policy.Stop(exc.outcome, exc.detail)
            decision = decision_mod.Decision("failed", exc.detail)
            return _record(lease, begun, reply, checks, decision, step, fingerprint, decider_usage)
    else:
        decision = decision_mod.from_checks(checks, act_ok=reply.ok, act_detail=reply.detail)
    progress = [*history.get("progress", []), [fingerprint, policy.checks_signature(checks)]][-3:]
    state = policy.State(
        iteration=begun.number,
        max_iterations=run.max_iterations,
        act_ok=reply.ok,
        act_detail=reply.detail,
        recent_instructions=tuple(recent),
        progress=tuple((p[0], p[1]) for p in progress),
        has_checks=bool(instance.checks),
        deadline_passed=bool(run.deadline and timezone.now() >= run.deadline),
    )
    step = policy.next_step(state, decision, checks)
    extra: list[tuple[str, dict[str, Any]]] = []
    if isinstance(step, policy.Stop) and step.outcome == Run.Outcome.DONE:
        # A clean exit is not success: grade what the run hands back before calling it done.
        final = graders.FinalAct(begun.number, reply.text, fingerprint)
        grade = graders.grade(run, final, checks, stop=lease.stop)
        step = grade.apply(step)
        decider_usage = decider_usage.add(grade.usage)
        extra.append(grade.as_event(begun.number))
    return _record(lease, begun, reply, checks, decision, step, fingerprint, decider_usage, extra)


def _decider_snapshot(run: Run, begun: Begun, reply: Reply, checks: list[policy.Check]) -> dict[str, Any]:
    return {
        "objective": run.objective,
        "iteration": begun.number,
        "max_iterations": run.max_iterations,
        "instruction": begun.instruction,
        "response": reply.text[-EXCERPT * 2 :],
        "act_ok": reply.ok,
        "act_detail": reply.detail,
        "checks": checks_mod.as_json(checks),
        "history": list((run.history or {}).get("snapshot", [])),
    }


def _begin(lease: Lease) -> Begun | None:
    """Open the iteration: stop?, deadline?, fold interjections, reserve. One transaction."""
    with transaction.atomic():
        run = Run.objects.select_related("instance").filter(pk=lease.run_id, lease_token=lease.token).first()
        if run is None:
            raise LeaseLost
        number = run.next_iteration
        jsonlog.bind(iteration=number)
        if run.cancel_requested_at is not None:
            _finish(lease, Run.Outcome.CANCELLED, f"stopped by a person before iteration {number}")
            return None
        if run.deadline and timezone.now() >= run.deadline:
            _finish(lease, Run.Outcome.TIMED_OUT, f"the run's wall-clock limit passed before iteration {number}")
            return None
        approved = list((run.history or {}).get("approved_calls", []))
        base = run.next_instruction or run.objective
        instruction = base
        try:
            with transaction.atomic():  # a savepoint: a refusal undoes the iteration's start
                pending = list(
                    run.interjections.filter(
                        Q(consumed_in_iteration__isnull=True) | Q(consumed_in_iteration=number)
                    )
                )
                if pending:
                    Interjection.objects.filter(pk__in=[i.pk for i in pending]).update(consumed_in_iteration=number)
                    notes = "\n".join(f"- {i.text}" for i in pending)
                    instruction = f"{base}\n\nA person sent these messages; take them into account first:\n{notes}"
                events.append_many(
                    run.pk,
                    [
                        (
                            "iteration.started",
                            {"iteration": number, "instruction": instruction[:EXCERPT], "interjections": len(pending)},
                        ),
                        ("act.started", {"iteration": number}),
                    ],
                )
                # Last write of the transaction: shared pools stay locked only until the commit.
                reservation = ledger.reserve(run=run, iteration=number, amount=pricing.estimate_iteration(run))
        except ledger.BudgetRefused as refused:
            _finish(lease, Run.Outcome.BUDGET_EXHAUSTED, refused.detail)
            return None
    return Begun(run, number, instruction, base, reservation, timezone.now(), approved)


def _record(
    lease: Lease,
    begun: Begun,
    reply: Reply,
    checks: list[policy.Check],
    decision: decision_mod.Decision,
    step: policy.Continue | policy.Stop,
    fingerprint: str,
    decider_usage: Usage,
    extra_events: list[tuple[str, dict[str, Any]]] | None = None,
) -> bool:
    """Close the iteration: record it, settle its cost, apply the policy. One transaction."""
    _enter(lease)
    run, number = begun.run, begun.number
    usage = reply.usage.add(decider_usage)
    cost = pricing.usage_cost(usage)
    now = timezone.now()
    history = dict(run.history or {})
    history.pop("approved_calls", None)  # handed to this act; never run twice
    pending = [c for c in reply.tool_calls if c.get("needs_approval")]
    if pending:
        history["pending_approval"] = pending
    history["instructions"] = [*history.get("instructions", []), begun.base_instruction][-3:]
    history["progress"] = [*history.get("progress", []), [fingerprint, policy.checks_signature(checks)]][-3:]
    history["snapshot"] = [
        *history.get("snapshot", []),
        {
            "iteration": number,
            "instruction": begun.base_instruction[:500],
            "response": reply.text[-500:],
            "checks": {c.name: c.passed for c in checks},
            "verdict": decision.verdict,
        },
    ][-20:]
    fields: dict[str, Any] = {
        "next_iteration": number + 1,
        "spent_micros": F("spent_micros") + cost,
        "history": history,
        "attempt": 1,
    }
    duration_ms = int((now - begun.started_at).total_seconds() * 1000)
    iteration_data = {
        "iteration": number,
        "cost_usd": micros_to_usd(cost),
        "duration_ms": duration_ms,
        "act_ok": reply.ok,
    }
    with transaction.atomic():
        if isinstance(step, policy.Continue):
            fields.update(next_instruction=step.instruction, lease_expires_at=now + lease_seconds())
        elif step.outcome == Run.Outcome.ESCALATED:
            fields.update(
                status=Run.Status.WAITING,
                outcome_detail=step.detail,
                next_instruction=decision.next_instruction or begun.base_instruction,
                lease_token=None,
                lease_holder="",
                lease_expires_at=None,
            )
        updated = Run.objects.filter(pk=run.pk, lease_token=lease.token, next_iteration=number).update(**fields)
        if not updated:
            raise LeaseLost
        Iteration.objects.create(
            run=run,
            number=number,
            instruction=begun.instruction,
            response=reply.text[-settings.TETHER_OUTPUT_CAP_BYTES :],
            act_ok=reply.ok,
            act_detail=reply.detail[:2000],
            checks=checks_mod.as_json(checks),
            decision={"verdict": decision.verdict, "reason": decision.reason, "next": decision.next_instruction},
            fingerprint=fingerprint,
            cost_micros=cost,
            usage=usage.as_json(),
            worker=lease.holder,
            lease_token=lease.token,
            started_at=begun.started_at,
            finished_at=now,
        )
        items: list[tuple[str, dict[str, Any]]] = [
            (
                "act.finished",
                {
                    "iteration": number,
                    "ok": reply.ok,
                    "detail": reply.detail[:500],
                    "response": reply.text[-EXCERPT:],
                    "tool_calls": reply.tool_calls[:50],
                    "usage": usage.as_json(),
                },
            ),
        ]
        if checks:
            items.append(
                (
                    "checks.finished",
                    {
                        "iteration": number,
                        "checks": [
                            {"name": c.name, "required": c.required, "passed": c.passed, "output": c.output[-1000:]}
                            for c in checks
                        ],
                    },
                )
            )
        items.append(
            (
                "decision.made",
                {"iteration": number, "verdict": decision.verdict, "reason": decision.reason[:1000]},
            )
        )
        items.extend(extra_events or [])
        items.append(("iteration.finished", iteration_data))
        if isinstance(step, policy.Stop) and step.outcome == Run.Outcome.ESCALATED:
            items.append(("run.waiting", {"iteration": number, "question": step.detail[:2000]}))
            after_finish(run.pk)
        events.append_many(run.pk, items)
        if isinstance(step, policy.Stop) and step.outcome != Run.Outcome.ESCALATED:
            _finish(lease, step.outcome, step.detail, step.verified)
        # Last write of the transaction: shared pools stay locked only until the commit.
        ledger.settle(begun.reservation, actual=cost)
    return isinstance(step, policy.Continue)
