"""What people do to runs: start, cancel, interject, resume, close, continue (`Run` names its other writers).

The API, the console and the CLI call these; none of them touches a run directly.
Each change is one short transaction; events are appended inside it and viewers
are woken after it commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import trail
from budgets import booking, money
from budgets import services as budget_services
from budgets.pricing import UnpricedModel
from instances import credentials, prices, sandbox
from instances.models import Instance
from loops import continuation, delegation, events, lifecycle, liveness, tasks
from loops.memory import Memory
from loops.models import Interjection, Run
from tether import refusals
from tether.limits import MAX_ITERATIONS, MAX_MINUTES, MESSAGE_MAX_CHARS


class Refused(refusals.Refused):
    """A request the service will not carry out; `message` says what to do instead."""


def _usd_to_micros(value: Any, field: str) -> int:
    """Return a cap typed in dollars as micro-dollars, exactly; Refused if it is not a positive amount."""
    if isinstance(value, bool) or not isinstance(value, Decimal | str | int | float):
        raise Refused(f"{field} must be a number of US dollars, like 2.50; got {value!r}")
    try:
        micros = money.usd_to_micros(value, exact=True, allow_negative=True)
    except money.MoneyError as exc:
        raise Refused(f"{field} must be a number of US dollars, like 2.50: {exc}") from None
    if micros <= 0:
        raise Refused(f"{field} must be more than 0 dollars; got {value}")
    return micros


@dataclass(frozen=True)
class Origin:
    """How a run started (`Run.Origin`), and which schedule and firing or trigger and delivery."""

    kind: str
    ref: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in Run.Origin.values:
            raise ValueError(f"unknown run origin {self.kind!r}; one of {', '.join(Run.Origin.values)}")

    @classmethod
    def of(cls, via: str, parent: Run | None = None) -> Origin:
        """Return the origin of a run a person or a client asked for through `via` (or a parent delegated)."""
        if parent is not None:
            return cls(Run.Origin.DELEGATION, {"parent": parent.pk})
        return cls(via)


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
    parent: Run | None = None,
    delegation: dict[str, Any] | None = None,
    origin: Origin | None = None,
) -> Run:
    """Create a run of `instance` toward `objective` and schedule its first iteration.

    `parent` and `delegation`: a child run started by a run's `delegate` call (loops.delegation).
    `origin`: how it started, when not a person or a client through `via` (a schedule, a trigger).
    """
    origin = origin or Origin.of(via, parent)
    ensure_startable(instance)  # an instance that cannot run refuses any request (409 before 400)
    if user is not None and not getattr(user, "is_active", True):
        raise Refused(f"the account {user.get_username()!r} is deactivated: it starts no runs", 409)
    objective = _checked_objective(instance, objective)
    if max_iterations is None:
        max_iterations = instance.max_iterations
    max_iterations = _checked_iterations(max_iterations)
    max_cost = None if max_cost_usd in (None, "") else _usd_to_micros(max_cost_usd, "max_cost_usd")
    deadline = _deadline(max_minutes)
    with transaction.atomic():
        run = _open(
            instance=instance, user=user, objective=objective, max_iterations=max_iterations, max_cost=max_cost,
            deadline=deadline, via=via, origin=origin, next_instruction=objective,
            **({} if parent is None else {"parent": parent, "depth": parent.depth + 1, "delegation": delegation or {}}),
        )
        trail.record(
            user=user, action="run.start", run=run, request=request, via=via,
            detail={"objective": objective[:500], "max_iterations": max_iterations, "max_cost_usd": max_cost_usd,
                    "origin": origin.kind, **origin.ref},
        )
        tasks.schedule(run.pk, run.next_iteration)
    return run


def _checked_objective(instance, objective: str) -> str:
    # CRLF is one line break, as in the console's form: it counts (and is stored) as one character.
    objective = (objective or "").replace("\r\n", "\n").strip()
    if not objective:
        raise Refused("objective is empty: say what the agent should achieve")
    if len(objective) > instance.objective_max_chars:
        raise Refused(
            f"objective is {len(objective):,} characters; this instance accepts at most "
            f"{instance.objective_max_chars:,}. Shorten it or raise the instance's objective cap."
        )
    return objective


def _checked_iterations(max_iterations: Any) -> int:
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int) or not 1 <= max_iterations <= MAX_ITERATIONS:
        raise Refused(f"max_iterations must be a whole number from 1 to {MAX_ITERATIONS}; got {max_iterations!r}")
    return max_iterations


def _deadline(max_minutes: Any):
    if max_minutes is None:
        return None
    if isinstance(max_minutes, bool) or not isinstance(max_minutes, int) or not 1 <= max_minutes <= MAX_MINUTES:
        raise Refused(f"max_minutes must be a whole number of minutes from 1 to {MAX_MINUTES}; got {max_minutes!r}")
    return timezone.now() + timedelta(minutes=max_minutes)


def ensure_startable(instance) -> None:
    """Refuse a run the instance cannot make: owner deactivated, archived, no usable credential, an unpriced
    model, no sandbox.

    `run_start` asks this first; a caller about to open a transaction around `run_start` asks it
    before, so the sandbox's first probe (a subprocess) never runs inside a transaction.
    """
    # The request is fine; the instance is not ready to run (archived, no usable key, no price): 409, not 400.
    if not instance.owner.is_active:
        # A trigger's hook or a schedule starts runs without the owner's session: the account's state decides.
        raise Refused(f"Instance {instance.name!r} belongs to a deactivated account: it starts no new runs.", 409)
    if instance.archived_at is not None:
        raise Refused(
            f"Instance {instance.name!r} is archived: it starts no new runs. Restore it from its page "
            "in the console, or use another instance.",
            409,
        )
    try:
        credentials.ensure_usable(instance)
    except ValueError as exc:
        raise Refused(str(exc), 409) from None
    try:
        prices.ensure_priced(instance)
    except UnpricedModel as exc:
        raise Refused(str(exc), 409) from None
    if sandbox.runs_programs(instance) and (problem := sandbox.problem()):
        raise Refused(f"Instance {instance.name!r} runs programs and the sandbox is unavailable: {problem}.")


def _open(
    *, instance, user, objective: str, max_iterations: int, max_cost, deadline, via: str, origin: Origin, **fields: Any
) -> Run:
    """Create the run with its pools and its `run.started` event (inside the caller's transaction)."""
    run = Run.objects.create(
        instance=instance,
        owner=user,
        objective=objective,
        max_iterations=max_iterations,
        max_cost_micros=max_cost,
        deadline=deadline,
        lease_expires_at=tasks.pickup_deadline(),
        origin=origin.kind,
        origin_ref=origin.ref,
        **fields,
    )
    try:
        budget_services.open_run_pools(run)
    except booking.InvalidBudget as exc:
        raise Refused(str(exc)) from None
    started = {
        "objective": objective[:2000],
        "instance": instance.pk,
        "max_iterations": max_iterations,
        "max_cost_usd": None if max_cost is None else money.usd_string(max_cost),
        "by": user.get_username(),
        "via": via,
        "origin": {"kind": origin.kind, **origin.ref},
    }
    if run.continued_from_id is not None:
        started["continued_from"] = run.continued_from_id
    if run.parent_id is not None:
        started["parent"] = run.parent_id
    events.append(run.pk, "run.started", started)
    return run


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def run_cancel(*, run: Run, user, via: str = "api", request=None) -> Run:
    """Stop the run: at once when no live driver holds it, else at the driver's next check (<1 s)."""
    held = Run.objects.filter(pk=run.pk).values_list("lease_token", "lease_holder").first()
    # A dead driver's lost attempt: what it changed is asked before the transaction (git).
    changes = lifecycle.lost_changes(run.pk) if held and held[0] and liveness.holder_gone(held[1]) else None
    with transaction.atomic():
        run = _locked(run)
        if run.status == Run.Status.FINISHED:
            raise Refused(f"run {run.pk} already finished ({run.outcome}); there is nothing to stop", 409)
        now = timezone.now()
        if run.cancel_requested_at is None:
            Run.objects.filter(pk=run.pk).update(cancel_requested_at=now)
            events.append(run.pk, "run.stop_requested", {"by": user.get_username(), "via": via})
            trail.record(user=user, action="run.stop", run=run, request=request, via=via, detail={"status": run.status})
        # Its driver died (a killed worker): don't wait for the lease to expire, finish it here too.
        holder_gone = run.lease_token is not None and liveness.holder_gone(run.lease_holder)
        if run.lease_token is None or holder_gone:
            # Nobody is driving it (queued or waiting): finish it here.
            who = user.get_username()
            if holder_gone:
                detail = f"stopped by {who} in iteration {run.next_iteration}, whose worker had died"
            elif run.status == Run.Status.QUEUED:
                detail = f"stopped by {who} before it was picked up"
            elif run.waiting_for_children:
                detail = f"stopped by {who} while its children ran"
            else:
                detail = f"stopped by {who} while it waited for a person"
            lifecycle.finish_unheld(run, detail, now, changes)
        live_children = list(run.children.exclude(status=Run.Status.FINISHED))
    for child in live_children:  # a stop cascades to every live descendant
        try:
            run_cancel(run=child, user=user, via=via, request=request)
        except Refused:
            pass  # it finished meanwhile
    run.refresh_from_db()
    return run


def run_interject(
    *, run: Run, user, text: str, approve: bool | None = None, via: str = "api", request=None
) -> Interjection:
    """Queue a message for the next iteration; on a waiting run it is the answer that resumes it.

    `approve` answers a run parked on tool calls that need a person: True runs them at
    the start of the next act, False tells the agent they were refused (and why: `text`).
    """
    text = (text or "").replace("\r\n", "\n").strip()  # a CRLF is one character, as everywhere else
    if not text and approve is not None:
        text = "Approved." if approve else "Refused."
    if not text:
        raise Refused("the message is empty")
    if len(text) > MESSAGE_MAX_CHARS:
        raise Refused(f"the message is {len(text):,} characters; at most {MESSAGE_MAX_CHARS:,} are accepted")
    with transaction.atomic():
        run = _locked(run)
        if run.status == Run.Status.FINISHED:
            raise Refused(
                f"run {run.pk} already finished ({run.outcome}); start a new run to continue the work", 409
            )
        if run.cancel_requested_at is not None:
            raise Refused(f"run {run.pk} is being stopped; the message would never be read", 409)
        memory = Memory.of(run.history)
        if approve is not None:
            if run.status != Run.Status.WAITING or not memory.pending_approval:
                raise Refused(f"run {run.pk} has no tool call waiting for approval", 409)
            calls = ", ".join(str(c.get("name")) for c in memory.pending_approval)
            if approve:
                text = f"{text}\n(The person approved: {calls}; they run first in this act.)"
            else:
                text = f"{text}\n(The person refused: {calls}. Do not try them again; find another way.)"
            Run.objects.filter(pk=run.pk).update(history=memory.answered(approve).as_json())
        interjection = Interjection.objects.create(run=run, author=user, text=text)
        action = "run.answer" if run.status == Run.Status.WAITING else "run.interject"
        trail.record(
            user=user, action=action, run=run, request=request, via=via,
            detail={"text": text[:500], "approve": approve},
        )
        events.append(
            run.pk,
            "interjection.queued",
            {"id": interjection.pk, "text": text[:2000], "by": user.get_username(), "via": via},
        )
        if run.status == Run.Status.WAITING and not delegation.waiting_for_children(run):
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
        if run.parent_id is not None:
            raise Refused(
                f"run {run.pk} was delegated by run {run.parent_id}, and its budget went back to that run when "
                "it finished: the parent decides what comes next",
                409,
            )
        if run.next_iteration > run.max_iterations:
            raise Refused(f"run {run.pk} has used all {run.max_iterations} iterations", 409)
        if new_cap is not None:
            if run.max_cost_micros is not None and new_cap <= run.max_cost_micros:
                raise Refused(
                    f"max_cost_usd must be above the run's current cap of {money.format_usd(run.max_cost_micros)}"
                )
            try:
                budget_services.run_set_cap(run, new_cap, user, via=via, request=request)
            except booking.InvalidBudget as exc:
                raise Refused(str(exc)) from None
            Run.objects.filter(pk=run.pk).update(max_cost_micros=new_cap)
        Run.objects.filter(pk=run.pk).update(outcome="", outcome_detail="", verified=None, finished_at=None)
        trail.record(user=user, action="run.resume", run=run, request=request, via=via, detail={})
        _reschedule(run, "run.resumed", {"by": user.get_username(), "via": via, "reason": "budget"})
    run.refresh_from_db()
    return run


def run_close(*, run: Run, user, via: str = "api", request=None) -> Run:
    """Close a waiting (escalated) run as `escalated` instead of answering it."""
    with transaction.atomic():
        run = _locked(run)
        if run.status != Run.Status.WAITING:
            raise Refused(f"only a waiting run can be closed; run {run.pk} is {run.status}", 409)
        if delegation.waiting_for_children(run):
            raise Refused(f"run {run.pk} is waiting for its children, not for a person; stop it instead", 409)
        detail = f"{run.outcome_detail}\n(closed by {user.get_username()} without an answer)".strip()
        closed = lifecycle.finish_run(run.pk, run.lease_token, Run.Outcome.ESCALATED, detail, run.verified)
        assert closed is not None  # locked and waiting: nobody else can hold it
        trail.record(user=user, action="run.close", run=closed, request=request, via=via, detail={})
    return closed


def run_continue(
    *,
    run: Run,
    user,
    max_iterations: int | None = None,
    max_cost_usd: Any = None,
    max_minutes: int | None = None,
    message: str | None = "",
    via: str = "api",
    request=None,
) -> Run:
    """Start a new run that picks up where finished `run` stopped; `run` itself is left as it was.

    The new run has `run`'s instance, objective and owner, and is linked to it (`continued_from`).
    It carries `run`'s memory (the rolling snapshot, which its first instruction also spells
    out), its protected-evidence baseline and changed paths (what an agent changed before still
    keeps a done from being verified), and the person's `message`, queued for its first
    iteration like any message. The workspace is the instance's, so the new run finds it as `run`
    left it: nothing is copied or undone. Limits default to `run`'s (a fresh cap of the same size).

    Any finished run can be continued, once (`loops.continuation.refusal`), except a budget_exhausted
    one (resumed in place: `run_resume`). A verified done is followed up: `message` is required and
    is the new run's objective. A credential_error run is continued only once the instance's key
    works again (asked of the provider, for free, before anything is reserved). A delegated child is
    continued as a child of the same parent when that parent still waits for it (the parent then
    waits for the continuation and reads its result instead, `_continue`); otherwise as a run of its
    own, whose end is told to the person (`loops.delegation.delegated_by`).
    """
    if run.owner_id != user.pk:
        raise Refused(f"run {run.pk} not found", 404)
    message = _checked_message(message)
    max_iterations = _checked_iterations(run.max_iterations if max_iterations is None else max_iterations)
    new_cap = None if max_cost_usd in (None, "") else _usd_to_micros(max_cost_usd, "max_cost_usd")
    deadline = _deadline(max_minutes)
    objective = run.objective
    if continuation.follows_up(outcome=run.outcome, verified=run.verified):
        if not message:
            raise Refused(
                f"run {run.pk} is done and verified: to follow it up, say what to do next in the message "
                "(it becomes the new run's objective)"
            )
        objective = _checked_objective(run.instance, message)
    ensure_startable(run.instance)  # outside the transaction: it may probe the sandbox
    if run.status == Run.Status.FINISHED and run.outcome == Run.Outcome.CREDENTIAL_ERROR:
        _ensure_key_works(run)  # outside the transaction too: it asks the provider
    try:
        new = _continue(
            run=run, user=user, objective=objective, max_iterations=max_iterations, cap=new_cap, deadline=deadline,
            message=message, via=via, request=request,
        )
    except IntegrityError:  # a second continuation raced this one past the check; the link is unique
        raise Refused(f"run {run.pk} was already continued; reload it to see as which run", 409) from None
    return new


def _ensure_key_works(run: Run) -> None:
    """Refuse to continue a run that ended credential_error while its instance's key still fails."""
    from instances.brains.anthropic.session import (
        check_key,  # lazy: the Anthropic SDK takes seconds to import
    )

    instance = Instance.objects.select_related("credential").get(pk=run.instance_id)  # the key as it is now
    if problem := check_key(instance):
        raise Refused(
            f"run {run.pk} ended credential_error, and the instance's key still does not work: {problem}. "
            "Fix the credential (or select another on the instance), then continue the run; nothing was spent",
            409,
        )


def _continue(
    *, run: Run, user, objective: str, max_iterations: int, cap: int | None, deadline, message: str, via: str, request
) -> Run:
    """Check, then create the continuation of `run` in one transaction (see `run_continue`)."""
    with transaction.atomic():
        # A child's parent first (the order every path locks a parent and its children in).
        parent = Run.objects.select_for_update().filter(pk=run.parent_id).first() if run.parent_id else None
        old = _locked(run)
        why = continuation.refusal(
            run_id=old.pk, status=old.status, outcome=old.outcome, verified=old.verified,
            next_iteration=old.next_iteration, max_iterations=old.max_iterations,
        )
        if why:
            raise Refused(why, 409)
        if (later := Run.objects.filter(continued_from=old).first()) is not None:
            raise Refused(f"run {old.pk} was already continued as run {later.pk}; continue that one instead", 409)
        follow_up = objective if continuation.follows_up(outcome=old.outcome, verified=old.verified) else ""
        history = continuation.carried_history(old.history, run_id=old.pk, iterations_done=old.iterations_done)
        first = continuation.first_instruction(
            run_id=old.pk,
            outcome=old.outcome,
            detail=old.outcome_detail,
            carried=history.get("snapshot", []),
            last_instruction=old.next_instruction or old.objective,
            follow_up=follow_up,
        )
        cap = old.max_cost_micros if cap is None else cap
        # A child whose parent still waits for it: the continuation takes its place among the parent's
        # children (its cap carved from the parent's budget), and the parent reads its result instead.
        waits = parent is not None and delegation.waits_for(parent, old.pk)
        family: dict[str, Any] = (
            {"parent": parent, "depth": old.depth, "delegation": dict(old.delegation or {})} if waits else {}
        )
        new = _open(
            instance=old.instance, user=user, objective=objective, max_iterations=max_iterations,
            max_cost=cap, deadline=deadline, via=via, origin=Origin.of(via),
            continued_from=old, next_instruction=first, history=history,
            protected_baseline=old.protected_baseline, protected_changed=list(old.protected_changed or []),
            **family,
        )
        if waits:
            assert parent is not None
            delegation.replace_child(parent, old.pk, new.pk, by=user.get_username())
        if message and not follow_up:
            note = Interjection.objects.create(run=new, author=user, text=message)
            events.append(
                new.pk, "interjection.queued", {"id": note.pk, "text": message[:2000], "by": user.get_username(), "via": via}
            )
        trail.record(
            user=user, action="run.continue", run=new, request=request, via=via,
            detail={"continued_from": old.pk, "message": message[:500], "max_iterations": max_iterations,
                    "max_cost_usd": None if cap is None else money.usd_string(cap),
                    **({"parent": parent.pk} if waits and parent is not None else {})},
        )
        tasks.schedule(new.pk, new.next_iteration)
    return new


def _checked_message(text: Any) -> str:
    """Return a person's message with line breaks as one character each; Refused if it cannot be stored."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise Refused(f"message must be text; got {type(text).__name__}")
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if "\x00" in text:
        raise Refused("message contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused("message contains a lone surrogate (text that is not valid Unicode)") from None
    if len(text) > MESSAGE_MAX_CHARS:
        raise Refused(f"message is {len(text):,} characters; at most {MESSAGE_MAX_CHARS:,} are accepted")
    return text


def _reschedule(run: Run, kind: str, data: dict[str, Any]) -> None:
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.QUEUED, lease_token=None, lease_holder="", lease_expires_at=tasks.pickup_deadline(), attempt=0
    )
    events.append(run.pk, kind, data)
    tasks.schedule(run.pk, run.next_iteration)


