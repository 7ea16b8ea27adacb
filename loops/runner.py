"""Drive one claimed run, one fenced iteration at a time.

Runs in a worker thread. An iteration is begun (`_begin`), then travels as one value, a `Turn`,
through act → verify → decide → record (`_iterate` reads as that list) and ends as one `Ended`,
which `_record` writes. Every write is fenced by the run's lease token (`loops.leases`) and its
`next_iteration`, so a stale or duplicate driver changes nothing. No transaction, row lock or (on
PostgreSQL) database connection is held across the act or the checks: an iteration opens with
`_begin` and closes with `_record`, one short transaction each, and in a steady run the record
begins the next iteration too, so each is one. A transient database error (a cut connection, a
serialization failure, a lock timeout) in either is retried on a fresh connection
(`tether.dbfaults`); only a lost lease or a dead process ends an attempt. A finish, and what
follows it, is `loops.lifecycle`'s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from budgets import ledger, metering, money
from instances import brains, sandbox
from instances.brains import get_brain
from instances.brains.base import ActRequest, BrainError, Reply, Usage
from instances.models import Instance
from loops import checks as checks_mod
from loops import (
    compaction,
    delegation,
    event_kinds,
    events,
    grading,
    journal,
    leases,
    lifecycle,
    policy,
    progress,
    signals,
)
from loops import decision as decision_mod
from loops.event_kinds import EXCERPT
from loops.leases import Lease, LeaseLost
from loops.memory import Memory
from loops.models import Interjection, Iteration, Run
from tether import dbfaults, dbpool, jsonlog, tracing

log = logging.getLogger(__name__)

IDLE_PING_SECONDS = 1.0  # a connection idle longer than this during an act is pinged before it is written to


@dataclass
class Begun:
    run: Run
    number: int
    instruction: str
    base_instruction: str
    reservation: ledger.Held | None
    started_at: Any
    approved_calls: list[dict[str, Any]] = field(default_factory=list)
    attempt: int = 1  # 2 and up: an earlier attempt of this iteration was lost
    memory: Memory = field(default_factory=Memory)  # the run's, as this iteration began


# --- one iteration ----------------------------------------------------------------------


def drive(lease: Lease, slice_seconds: float | None = None) -> None:
    """Drive the claimed run until it stops, the lease is lost, or the slice ends."""
    slice_seconds = settings.TETHER_SLICE_SECONDS if slice_seconds is None else slice_seconds
    ends = time.monotonic() + slice_seconds
    logged = jsonlog.bind(run_id=lease.run_id)  # log lines say which run (and iteration, see _begin)
    try:
        lease.enter()  # the first begin too: a flood of claimed runs stays within the process's connections
        begun = _begin(lease)
        while begun is not None:
            # Until the slice ends, an iteration's record begins the next one in its transaction.
            going = iterate(lease, begun, fuse_until=ends)
            if isinstance(going, Begun):
                begun = going
            elif not going:
                return
            elif time.monotonic() >= ends:
                leases.hand_back(lease)
                return
            else:
                begun = _begin(lease)
    except LeaseLost:
        log.info("run %s: lease lost; another driver has it", lease.run_id)
    finally:
        lease.leave()
        dbfaults.hold_no_connection(False)
        jsonlog.restore(logged)


@dataclass(frozen=True)
class Ended:
    """How one iteration ended, as one value: everything `_record` writes of it.

    Every path builds one — a refused workspace, a failed act, a person's stop, a reported
    overdraft, a park, an act that was checked and decided — and `_record` takes it whole.
    """

    reply: Reply
    decision: decision_mod.Decision
    step: policy.Continue | policy.Stop
    checks: list[policy.Check] = field(default_factory=list)
    fingerprint: str = ""
    decider_usage: Usage = field(default_factory=Usage)
    extra_events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    protected_changed: list[str] = field(default_factory=list)
    delegated: list[dict[str, Any]] | None = None  # the delegate calls a park waits for
    delegation_key: str = ""  # what the act delegated, for the no-progress rule ("" when nothing)


def _failed(reply: Reply, step: policy.Stop, reason: str, **more: Any) -> Ended:
    """An iteration that `step` ends before any verdict: a refusal, a failed act, a stop, an overdraft."""
    return Ended(reply, decision_mod.Decision("failed", reason), step, **more)


@dataclass(frozen=True, slots=True)
class Turn:
    """One iteration on its way from act to record, as one value: built once by `iterate`, passed along.

    Act → verify → decide → record each take it whole: the begun iteration (its run, number,
    instruction, memory and reservation), the lease that fences its writes, the meter every model
    call of it goes through, and until when its record may begin the next iteration. What a step
    finds travels with it: the act's `Reply`, then the `Verified` checks, then how it `Ended`.
    """

    lease: Lease
    begun: Begun
    meter: metering.RunMeter
    fuse_until: float | None = None  # a `time.monotonic()`: until then a going record begins the next

    @property
    def run(self) -> Run:
        return self.begun.run

    @property
    def number(self) -> int:
        return self.begun.number


@dataclass(frozen=True, slots=True)
class Verified:
    """What the checks found of an act: its reply, their results, the workspace's fingerprint, the instructions before."""

    reply: Reply
    checks: list[policy.Check]
    fingerprint: str
    recent: tuple[str, ...]


def iterate(lease: Lease, begun: Begun | None = None, fuse_until: float | None = None) -> Begun | bool:
    """Run one iteration (`begun`, or begin one); return whether the loop goes on under this lease.

    Before `fuse_until` (a `time.monotonic()`), an iteration whose policy goes on begins the next
    one in its record's transaction and returns it (`Begun`); True means it must be begun anew.
    """
    begun = begun or _begin(lease)
    if begun is None:
        return False
    with tracing.iteration(lambda: lifecycle.trace_ids(begun.run), begun.run.pk, begun.number, begun.run.attempt):
        # every model call of this iteration goes through its meter
        return _iterate(Turn(lease, begun, metering.RunMeter(begun.run, begun.number), fuse_until))


def _iterate(turn: Turn) -> Begun | bool:
    """Act → verify → decide → record: each way out of the iteration ends in one `_record`."""
    if (refused := _refused_workspace(turn)) is not None:
        return _record(turn, refused)
    _open_iteration(turn)
    reply = _act(turn)
    if isinstance(reply, Ended):
        return _record(turn, reply)
    if (ended := _cut_short(turn, reply)) is not None:
        return _record(turn, ended)
    if (park := _asked_to_wait(turn, reply)) is not None:
        return _record(turn, _parked(turn, reply, *park))
    return _record(turn, _judged(turn, reply))


def _refused_workspace(turn: Turn) -> Ended | None:
    """Check the workspace before anything of ours reads or runs in it; how the iteration ends if it is refused.

    Whether it nests with another instance's is asked of the database as the run starts, or an
    attempt starts again, not every iteration.
    """
    instance = turn.run.instance
    opening = turn.number == 1 or turn.begun.attempt > 1
    try:
        sandbox.checked_workspace(instance.workspace_path(), instance_id=instance.pk if opening else None)
    except sandbox.WorkspaceRefused as exc:
        refused = Reply(ok=False, text="", usage=Usage(), detail=str(exc))
        return _failed(refused, policy.Stop(Run.Outcome.FAILED, str(exc)), str(exc))
    return None


def _open_iteration(turn: Turn) -> None:
    """Say the run (or the iteration) starts, and let the database connection go for a long act."""
    lease, begun, run = turn.lease, turn.begun, turn.run
    if begun.number == 1:
        signals.run_starting.send(sender=Run, run=run)  # e.g. the review's diff starts here
        _take_protected_baseline(lease, run)
    if begun.attempt == 1:  # e.g. the workspace a lost attempt's changes are measured from
        signals.iteration_starting.send(sender=Run, run=run, number=begun.number)
    if not lease.keeps_connection and connection.vendor == "postgresql":
        lease.leave()
        connection.close()  # the act may be long; don't sit on one of the server's connections
        # ... nor, with a pool to give them back to, do the act's and the decider's writes, until `Lease.enter`
        dbfaults.hold_no_connection(dbpool.enabled())


def _act(turn: Turn) -> Reply | Ended:
    """Run the act: its reply, or how the iteration ends when the brain could not act."""
    begun, run, instance = turn.begun, turn.run, turn.run.instance
    request = ActRequest(
        run_id=run.pk,
        iteration=begun.number,
        objective=run.objective,
        instruction=begun.instruction,
        workspace=instance.workspace_path(),
        stop=turn.lease.stop,
        timeout=float(instance.act_timeout_seconds),
        snapshot=[dict(s) for s in begun.memory.snapshot],
        history=compaction.for_prompt(begun.memory.snapshot),
        approved_calls=begun.approved_calls,
        meter=turn.meter,
        journal=journal.ToolJournal(run.pk, begun.number, run.attempt),  # a re-run replays what this iteration ran
    )
    acting = time.monotonic()
    try:
        with tracing.span("act", tether__brain=instance.brain):
            reply = get_brain(instance).act(request)
    except BrainError as exc:  # what the act said and called so far is kept in its record
        reply = Reply(ok=False, text=exc.text, usage=exc.usage, detail=exc.detail, tool_calls=exc.tool_calls)
        return _failed(reply, policy.Stop(exc.outcome, exc.detail), exc.detail)
    # A connection kept across a long act may have been cut meanwhile: find out now, not mid-write
    # (an act of a moment leaves it to the record's own retry on a fresh connection).
    if time.monotonic() - acting > IDLE_PING_SECONDS:
        dbfaults.ensure_usable(what=f"run {run.pk}: after the act")
    return reply


def _confirm_stop(lease: Lease, run_id: int) -> None:
    """A stop cut the iteration short: go on to record it only if a person asked for the stop."""
    lease.enter()
    if not _stop_requested(run_id):
        raise LeaseLost  # stopped because this driver lost the run or is shutting down


def _cut_short(turn: Turn, reply: Reply) -> Ended | None:
    """How the iteration ends right after its act (a person's stop, a reported overdraft), or None."""
    if reply.stopped:
        _confirm_stop(turn.lease, turn.run.pk)
        step = policy.Stop(Run.Outcome.CANCELLED, f"stopped by a person during the act of iteration {turn.number}")
        return _failed(reply, step, "stopped mid-act")
    if overdraft := brains.reported_overdraft(turn.run.instance, reply.usage):
        # Only metered spend is hard-capped: an agent's own report above what its iteration
        # reserved ends the run at once; the ledger records the overdraft, and a pool it
        # overdrew grants nothing more until a person covers it.
        return _failed(reply, policy.Stop(Run.Outcome.BUDGET_EXHAUSTED, overdraft), overdraft)
    return None


_Wait = tuple[policy.Park, decision_mod.Decision, list[dict[str, Any]] | None, str]


def _asked_to_wait(turn: Turn, reply: Reply) -> _Wait | None:
    """The wait the act asks for (the children it delegated to, a person's approval), as `_parked` takes it."""
    if delegated := [call for call in reply.tool_calls if call.get("delegate")]:
        # Park until the children this act asked for have finished (loops.delegation starts them
        # once this iteration is recorded, and resumes the run when the last one ends) — if the
        # policy lets it wait: not on its last allowed iteration, nor to repeat what it delegated.
        key = delegation.repeat_key(turn.run, delegated, checks_mod.fingerprint(turn.run.instance.workspace_path()))
        park = policy.Park(
            "children", f"children running: {len(delegated)} delegated in iteration {turn.number}",
            undone=delegation.not_started(delegated),
        )
        return park, decision_mod.Decision("continue", park.detail), delegated, key
    if any(call.get("needs_approval") for call in reply.tool_calls):
        # Park the run for a person before spending anything on checks or a decider.
        detail = reply.detail or "a tool call needs a person's approval"
        park = policy.Park("approval", detail, undone=f"the tool calls that needed a person's approval were not run ({detail})")
        return park, decision_mod.Decision("escalate", detail), None, ""
    return None


def _judged(turn: Turn, reply: Reply) -> Ended:
    """Check what the act did, have it decided, and ask the policy what comes next (graders judge a done)."""
    lease, begun, run, instance = turn.lease, turn.begun, turn.run, turn.run.instance
    workspace = instance.workspace_path()
    changed, evidence = checks_mod.protected_changes(run, begun.number)  # before the checks: what the act did
    with tracing.span("checks") as traced:
        checks = checks_mod.run_checks(
            list(instance.checks or []), workspace, lease.stop, instance=instance, baseline=run.evidence_baseline
        )
        traced.set(tether__checks__passed=sum(c.passed for c in checks), tether__checks__total=len(checks))
    if lease.stop.is_set():  # a stop during the checks: what ran is no verdict, and a stop is never a done
        _confirm_stop(lease, run.pk)
        stopped = policy.Stop(Run.Outcome.CANCELLED, f"stopped by a person during the checks of iteration {begun.number}")
        return _failed(reply, stopped, "stopped by a person during the checks", checks=checks)
    verified = Verified(
        reply, checks, checks_mod.fingerprint(workspace), begun.memory.recent_instructions(begun.base_instruction)
    )
    with tracing.span("decider", tether__decider=instance.decider):
        decided = _decide(turn, verified)
    if isinstance(decided, Ended):
        return decided
    decision, decider_usage = decided
    state = _state_after(turn, verified)
    step = policy.next_step(state, decision, checks, protected_changed=changed)
    extra: list[tuple[str, dict[str, Any]]] = [evidence] if evidence else []
    if isinstance(step, policy.Stop) and step.outcome == Run.Outcome.DONE:
        # A clean exit is not success: the graders look at what the run hands back, then the
        # policy's verdict decides with what they found.
        reports = _graders(turn, verified)
        for report in reports:
            decider_usage = decider_usage.add(report.usage)
            extra.append(report.as_event(begun.number))
        grades = [report.assessment for report in reports]
        step = policy.next_step(state, decision, checks, grades, protected_changed=changed)
    if isinstance(step, policy.Continue) and step.stall == policy.STALL_REWIND:
        refused, rewound = signals.ask_rewind(turn.run, turn.lease.token, step.rewind_to, turn.begun.number)
        extra.append(rewound)
        if refused:  # not rewound: the stall handling goes on to its next stage
            step = policy.next_step(replace(state, rewind_refused=refused), decision, checks, protected_changed=changed)
    return Ended(reply, decision, step, checks, verified.fingerprint, decider_usage, extra, changed)


def _decide(turn: Turn, verified: Verified) -> tuple[decision_mod.Decision, Usage] | Ended:
    """The decider's decision and what it cost; or how the iteration ends when the LLM decider could not judge."""
    lease, run, instance, reply, checks = turn.lease, turn.run, turn.run.instance, verified.reply, verified.checks
    if instance.decider != instance.Decider.LLM:
        return decision_mod.from_checks(checks, act_ok=reply.ok, act_detail=reply.detail), Usage()
    from instances.brains.anthropic.decider import decide  # type: ignore[import-not-found]  # lazy: the Anthropic SDK takes seconds to import

    try:
        answer, decider_usage = decide(instance, _decider_snapshot(turn, verified), stop=lease.stop, meter=turn.meter)
        return decision_mod.parse(answer, recent_instructions=verified.recent), decider_usage
    except BrainError as exc:
        failure = exc
    step = policy.Stop(failure.outcome, failure.detail)
    if lease.stop.is_set():  # the decider's call was cut by a stop, not by the provider
        _confirm_stop(lease, run.pk)
        step = policy.Stop(Run.Outcome.CANCELLED, f"stopped by a person while the decider judged iteration {turn.number}")
    return _failed(reply, step, step.detail, checks=checks, fingerprint=verified.fingerprint, decider_usage=failure.usage)


def _state_after(turn: Turn, verified: Verified) -> policy.State:
    """What the policy knows of the run after an act that was checked and decided."""
    begun, run, memory = turn.begun, turn.run, turn.begun.memory
    reply, checks, recent, fingerprint = verified.reply, verified.checks, verified.recent, verified.fingerprint
    return policy.State(
        iteration=begun.number,
        max_iterations=run.max_iterations,
        act_ok=reply.ok,
        act_detail=reply.detail,
        failed_acts=memory.failed_in_a_row(reply.ok),
        recent_instructions=recent,
        progress=memory.recent_progress(fingerprint, policy.checks_signature(checks)),
        has_checks=bool(run.instance.checks),
        deadline_passed=bool(run.deadline and timezone.now() >= run.deadline),
        delegations=memory.recent_delegations(""),
        refusals=memory.recent_refusals(decision_mod.refusals(reply.tool_calls)),
        track=memory.recent_track(begun.number, progress.total(c.progress for c in checks), fingerprint),
        stall=memory.stall, stale_after=settings.TETHER_STALL_ITERATIONS, rewind=run.instance.rewind_on_stall,
        spent_micros=run.spent_micros, max_cost_micros=run.max_cost_micros,
    )


def _graders(turn: Turn, verified: Verified) -> list[Any]:
    """What the graders report of a proposed done (each with its assessment, its usage and its event)."""
    lease, begun, meter, checks = turn.lease, turn.begun, turn.meter, verified.checks
    final = grading.FinalAct(begun.number, verified.reply.text, verified.fingerprint)
    with tracing.span("judge"):  # the registered graders, in their declared order (loops.grading)
        return list(grading.grade(run=begun.run, final=final, checks=checks, stop=lease.stop, meter=meter))


def _parked(
    turn: Turn, reply: Reply, park: policy.Park, decision: decision_mod.Decision,
    delegated: list[dict[str, Any]] | None = None, key: str = "",
) -> Ended:
    """How an iteration whose act asks to wait (children, a person's approval) ends, as the policy allows."""
    begun, run, memory = turn.begun, turn.run, turn.begun.memory
    state = policy.State(
        iteration=begun.number, max_iterations=run.max_iterations, act_ok=True,  # asking to wait is no failure
        deadline_passed=bool(run.deadline and timezone.now() >= run.deadline),
        delegations=memory.recent_delegations(key), refusals=memory.recent_refusals(decision_mod.refusals(reply.tool_calls)),
    )
    step = policy.after(state, park)
    if isinstance(step, policy.Park):
        waiting = policy.Stop(Run.Outcome.ESCALATED, step.detail)
        return Ended(reply, decision, waiting, delegated=delegated, delegation_key=key)
    assert isinstance(step, policy.Stop)
    return Ended(reply, decision, step, delegation_key=key)


def _stop_requested(run_id: int) -> bool:
    return dbfaults.retry(
        lambda: Run.objects.filter(pk=run_id, cancel_requested_at__isnull=False).exists(),
        what=f"run {run_id}: stop requested?",
    )


def _take_protected_baseline(lease: Lease, run: Run) -> None:
    """Take the evidence as the run found it (once: a retried first iteration keeps it).

    The digests of the protected files, and the tests each pytest check collects.
    """
    if run.protected_baseline is not None:
        return
    baseline, collected = checks_mod.starting_evidence(run, lease.stop)

    def save() -> None:
        Run.objects.filter(pk=run.pk, lease_token=lease.token, protected_baseline__isnull=True).update(
            protected_baseline=baseline, evidence_baseline=collected
        )
        run.refresh_from_db(fields=["protected_baseline", "evidence_baseline"])

    dbfaults.retry(save, what=f"run {run.pk}: protected baseline")


def _decider_snapshot(turn: Turn, verified: Verified) -> dict[str, Any]:
    run, begun, reply = turn.run, turn.begun, verified.reply
    return {
        "objective": run.objective,
        "iteration": begun.number,
        "max_iterations": run.max_iterations,
        "instruction": begun.instruction,
        "response": reply.text[-EXCERPT * 2 :],
        "act_ok": reply.ok,
        "act_detail": reply.detail,
        "checks": checks_mod.as_json(verified.checks),
        "history": compaction.for_prompt(begun.memory.snapshot),
    }


def _begin(lease: Lease, *, retried: bool = False) -> Begun | None:
    """Open the iteration: stop?, deadline?, fold interjections, reserve. One transaction, retried.

    `retried`: this begin may have committed already (in a record whose commit was cut).
    """
    tries = 0

    def once() -> Begun | None:
        nonlocal tries
        tries += 1
        return _begin_once(lease, retried=retried or tries > 1)

    return dbfaults.retry(once, what=f"run {lease.run_id}: begin an iteration")


def _begin_once(lease: Lease, *, retried: bool) -> Begun | None:
    with transaction.atomic():
        # Locked: a stop that finishes the run meanwhile (judging its driver dead) is waited for,
        # and then fences this begin out; read unlocked, the begin would reserve on a finished run.
        unread = Interjection.objects.filter(run=OuterRef("pk")).filter(
            Q(consumed_in_iteration__isnull=True) | Q(consumed_in_iteration=OuterRef("next_iteration"))
        )
        run = (  # whether a person's message waits comes with it: read only when one does
            Run.objects.select_related("instance", "instance__credential").select_for_update(of=("self",))
            .annotate(messages_waiting=Exists(unread))
            .filter(pk=lease.run_id, lease_token=lease.token).first()
        )
        if run is None:
            raise LeaseLost
        number = run.next_iteration
        jsonlog.bind(iteration=number)
        if run.cancel_requested_at is not None:
            leases.finish(lease, Run.Outcome.CANCELLED, f"stopped by a person before iteration {number}")
            return None
        deadline_passed = bool(run.deadline and timezone.now() >= run.deadline)
        if (bound := policy.may_begin(number, run.max_iterations, deadline_passed)) is not None:
            leases.finish(lease, bound.outcome, bound.detail)
            return None
        memory = Memory.of(run.history)
        approved = [dict(c) for c in memory.approved_calls]
        base = run.next_instruction or run.objective
        instruction = base
        attempt = lifecycle.attempt_of(run, number)
        if attempt > 1 and (note := lifecycle.interrupted(run, number)):
            instruction = f"{base}\n\n{note}"
        # The reservation comes first: a refusal has written nothing to undo (no savepoint), and
        # with a quota lease it locks the run's own pool only (its ancestors when a slice is drawn).
        try:
            reservation = ledger.hold(run=run, iteration=number, amount=brains.iteration_reserve(run.instance))
        except ledger.BudgetRefused as refused:
            leases.finish(lease, Run.Outcome.BUDGET_EXHAUSTED, refused.detail)
            return None
        pending = list(
            run.interjections.filter(Q(consumed_in_iteration__isnull=True) | Q(consumed_in_iteration=number))
        ) if run.messages_waiting else []
        if pending:
            Interjection.objects.filter(pk__in=[i.pk for i in pending]).update(consumed_in_iteration=number)
            notes = "\n".join(f"- {i.text}" for i in pending)
            instruction = f"{instruction}\n\nA person sent these messages; take them into account first:\n{notes}"
        # A retry after a cut may find this very begin committed: don't say it twice.
        begun_before = retried and run.events.filter(
            seq__gt=lease.claimed_seq, kind="act.started", data__iteration=number
        ).exists()
        if not begun_before:
            events.append_many(run.pk, event_kinds.opening(number, instruction, attempt=attempt, interjections=len(pending)))
    return Begun(run, number, instruction, base, reservation, timezone.now(), approved, attempt, memory)


class _Unfused(Exception):
    """The next iteration's reservation was refused: record this one alone (the begin says why)."""


@dataclass(frozen=True, slots=True)
class _Closing:
    """What the record of an iteration writes, worked out before its transaction opens."""

    fields: dict[str, Any]  # the run's columns
    items: list[tuple[str, dict[str, Any]]]  # the events that close the iteration
    memory: Memory  # the run's, after this iteration
    usage: Usage  # the act's and the decider's
    cost: int  # micro-dollars, metered and not
    unmetered: int  # what the iteration's own reservation settles
    now: datetime


def _closing(turn: Turn, ended: Ended) -> _Closing:
    """Work out what `_record` writes of `ended`: the run's new columns, the events, the memory, the cost."""
    begun, number, reply, checks, step = turn.begun, turn.number, ended.reply, ended.checks, ended.step
    usage = reply.usage.add(ended.decider_usage)
    # Metered calls were settled one by one as they went; the iteration's own reservation
    # settles only what no meter saw (a command's reported spend).
    act_cost, act_unmetered = metering.split_cost(reply.usage, reply.usage.metered_micros)
    decider_cost, decider_unmetered = metering.split_cost(ended.decider_usage, ended.decider_usage.metered_micros)
    cost, unmetered = act_cost + decider_cost, act_unmetered + decider_unmetered
    now = timezone.now()
    memory = begun.memory.after(  # approvals handed to this act are spent: never run twice
        instruction=begun.base_instruction, fingerprint=ended.fingerprint, signature=policy.checks_signature(checks),
        act_ok=reply.ok, response=reply.text, checks={c.name: c.passed for c in checks}, verdict=ended.decision.verdict,
        number=number, pending=[c for c in reply.tool_calls if c.get("needs_approval")],
        delegation=ended.delegation_key, refused=decision_mod.refusals(reply.tool_calls),
        progress=progress.total(c.progress for c in checks), stall=step.stall,
        rewound_to=step.rewind_to if isinstance(step, policy.Continue) else 0,
    )
    fields = _recorded_fields(begun, step, ended.decision, ended.delegated, now) | {
        "next_iteration": number + 1, "spent_micros": F("spent_micros") + cost, "history": memory.as_json(), "attempt": 1,
    }
    if ended.protected_changed:
        fields["protected_changed"] = ended.protected_changed
    iteration_data = {
        "iteration": number, "cost_usd": money.usd_string(cost),
        "duration_ms": int((now - begun.started_at).total_seconds() * 1000), "act_ok": reply.ok,
    }
    items = event_kinds.closing(
        number, reply, checks, ended.decision, step, usage, ended.extra_events, iteration_data, ended.delegated
    )
    return _Closing(fields, items, memory, usage, cost, unmetered, now)


def _record(turn: Turn, ended: Ended) -> Begun | bool:
    """Close the iteration as `ended` says: record it, settle its cost, apply the policy's step. One transaction.

    When the policy goes on and the turn's `fuse_until` has not passed, the same transaction begins the
    next iteration if nothing stands in its way (a stop, the deadline, a person's message, an edited
    instance): its events join this one's, and its reservation is this one's settle rolled on.
    Returns that `Begun`, else whether the loop goes on.
    """
    lease, run, number, step = turn.lease, turn.run, turn.number, ended.step
    lease.enter()
    closing = _closing(turn, ended)
    going = isinstance(step, policy.Continue)
    fuse = going and turn.fuse_until is not None and time.monotonic() < turn.fuse_until and not lease.stop.is_set()
    base = (step.instruction if going else "") or run.objective
    reserve = brains.iteration_reserve(run.instance) if fuse else 0
    asked, tries = fuse, 0

    def once() -> ledger.Held | object | None:
        nonlocal fuse, tries
        try:
            tries += 1
            return _write_record(turn, ended, closing, tries > 1, fuse, base, reserve)
        except _Unfused:
            fuse, tries = False, tries + 1
            return _write_record(turn, ended, closing, True, False, base, reserve)

    reservation = dbfaults.retry(once, what=f"run {run.pk}: record iteration {number}")
    if reservation is _COMMITTED:
        return (_begin(lease, retried=True) or False) if asked else going
    if not isinstance(reservation, ledger.Held):
        return going
    memory = closing.memory
    run.next_iteration, run.next_instruction, run.history, run.attempt = (
        number + 1, closing.fields["next_instruction"], closing.fields["history"], 1
    )
    run.spent_micros += closing.cost
    run.protected_changed = ended.protected_changed or run.protected_changed
    jsonlog.bind(iteration=number + 1)
    return Begun(run, number + 1, base, base, reservation, timezone.now(), [dict(c) for c in memory.approved_calls], 1, memory)


def _write_record(
    turn: Turn, ended: Ended, closing: _Closing, retried: bool, fuse: bool, base: str, reserve: int
) -> ledger.Held | object | None:
    """The record's transaction: the next iteration's reservation when it began too, else None.

    `retried`: the connection may have died after this very record had committed (then `_COMMITTED`).
    """
    lease, begun, run, number, reply, step = turn.lease, turn.begun, turn.run, turn.number, ended.reply, ended.step
    delegated, now = ended.delegated, closing.now
    if retried and Iteration.objects.filter(run=run, number=number, lease_token=lease.token).exists():
        return _COMMITTED  # a begin finds what it wrote
    with transaction.atomic():
        current = Run.objects.filter(pk=run.pk, lease_token=lease.token, next_iteration=number)
        written = events.update_and_append_if(
            current, closing.fields, closing.items, _nothing_in_the_way(run, number + 1, now) if fuse else None,
            event_kinds.opening(number + 1, base, attempt=1, interjections=0),
        )
        if written is None:
            raise LeaseLost
        if delegated:
            transaction.on_commit(lambda: delegation.start_pending(run.pk))
        Iteration.objects.create(
            run=run, number=number, instruction=begun.instruction,
            response=reply.text[-settings.TETHER_OUTPUT_CAP_BYTES :], act_ok=reply.ok, act_detail=reply.detail[:2000],
            checks=checks_mod.as_json(ended.checks),
            decision={"verdict": ended.decision.verdict, "reason": ended.decision.reason, "next": ended.decision.next_instruction},
            fingerprint=ended.fingerprint, cost_micros=closing.cost, usage=closing.usage.as_json(), worker=lease.holder,
            lease_token=lease.token, started_at=begun.started_at, finished_at=now,
        )
        if written[1]:  # the next iteration has begun: this settle rolls on into its reservation
            try:
                return ledger.roll(begun.reservation, actual=closing.unmetered, run=run, iteration=number + 1, amount=reserve)
            except ledger.BudgetRefused:
                raise _Unfused from None
        # The settle comes before a finish or a park, so a finishing child's carve is refunded,
        # and the run's lease returned, at what it spent, this iteration included.
        ledger.settle(begun.reservation, actual=closing.unmetered)
        if isinstance(step, policy.Stop) and step.outcome == Run.Outcome.ESCALATED and not delegated:
            lifecycle.after_finish(run.pk)
        if isinstance(step, policy.Stop) and step.outcome != Run.Outcome.ESCALATED and not delegated:
            leases.finish(lease, step.outcome, step.detail, step.verified, held_for_review=step.held_for_review)
        return None


_COMMITTED = object()  # what a retried record returns when it finds its first try committed


def _recorded_fields(
    begun: Begun, step: policy.Continue | policy.Stop, decision: decision_mod.Decision,
    delegated: list[dict[str, Any]] | None, now: datetime,
) -> dict[str, Any]:
    """What the policy's step writes to the run besides the iteration's count, cost and memory."""
    if isinstance(step, policy.Continue):
        return {"next_instruction": step.instruction, "lease_expires_at": now + leases.lease_seconds()}
    parked = {"status": Run.Status.WAITING, "outcome_detail": step.detail, "lease_token": None, "lease_holder": "",
              "lease_expires_at": None}
    if delegated:
        return parked | {
            "next_instruction": begun.base_instruction,
            "delegation": {
                "state": "starting", "iteration": begun.number, "instruction": begun.base_instruction,
                "calls": delegated, "children": [], "refused": [],
            },
        }
    if step.outcome == Run.Outcome.ESCALATED:
        return parked | {"next_instruction": decision.next_instruction or begun.base_instruction}
    return {}


def _nothing_in_the_way(run: Run, number: int, now: datetime) -> tuple[str, list[Any]]:
    """What lets iteration `number` begin in its predecessor's record: what `_begin_once` checks, as SQL.

    No stop asked, the deadline not passed, no person's message waiting, the instance not edited
    since it was read. Written out once (this is every steady iteration's statement, and composing
    it from querysets cost more than the rest of the record). The run's own nullable columns are
    compared through COALESCE, never with IS NULL: SQLite 3.40 answers `IS NULL` wrongly on the
    updated row in a RETURNING clause.
    """
    adapt = connection.ops.adapt_datetimefield_value
    never, forever = adapt(datetime.min.replace(tzinfo=UTC)), adapt(datetime.max.replace(tzinfo=UTC))
    return _IN_THE_WAY, [never, never, forever, adapt(now), number, adapt(run.instance.updated_at)]


_RUN, _MESSAGE, _INSTANCE = Run._meta.db_table, Interjection._meta.db_table, Instance._meta.db_table
_IN_THE_WAY = (
    f'COALESCE("{_RUN}"."cancel_requested_at", %s) = %s AND COALESCE("{_RUN}"."deadline", %s) > %s'
    f' AND NOT EXISTS (SELECT 1 FROM "{_MESSAGE}" m WHERE m."run_id" = "{_RUN}"."id"'
    ' AND (m."consumed_in_iteration" IS NULL OR m."consumed_in_iteration" = %s))'
    f' AND EXISTS (SELECT 1 FROM "{_INSTANCE}" i WHERE i."id" = "{_RUN}"."instance_id" AND i."updated_at" = %s)'
)

