"""A run's end, and what follows it; the attempt a dead driver lost.

`finish_run` is the one place a run finishes: inside the caller's transaction, fenced by the
lease token, it writes the outcome, lets the lease go and appends `run.finished`; `after_finish`
follows every finish (and every park): a finished child's carve goes back to its parent, the
run's quota lease back to its pools' ancestors, and once the transaction commits
`signals.run_finished` tells the apps above (the review, the receipt, the notices; a waiting
parent is woken by `delegation.on_run_finished`) and the run's span is exported. `finish_unheld`
and `finish_stopped` finish a run no live driver holds. A driver that died mid-iteration lost an
attempt: `lost_changes` asks what it changed, `record_lost_attempt` closes what it had reserved
and says so once (the reaper, a claim taking over an expired lease, a release, a stop), and
`interrupted` tells the iteration's next attempt (`attempt_of`) what the lost one left.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from budgets import ledger, money
from budgets.models import Reservation
from loops import delegation, events, journal, selectors, signals
from loops.event_kinds import changed_names
from loops.models import Event, Run
from tether import tracing

log = logging.getLogger(__name__)

ACTIVE = (Run.Status.QUEUED, Run.Status.RUNNING)


def finish_unheld(
    run: Run, detail: str, now: datetime | None = None, changes: dict[str, Any] | None = None
) -> None:
    """Finish `run` cancelled where no live driver holds it (queued, waiting, or its driver died).

    Inside the caller's transaction, with `run` locked: a lost attempt is recorded (its open
    reservation closed as abandoned; `changes` from `lost_changes`, asked before the transaction),
    then the run finishes with its lease fenced out, as `leases.finish` does for a driver.
    """
    record_lost_attempt(run, run.lease_holder, changes)
    finish_run(run.pk, run.lease_token, Run.Outcome.CANCELLED, detail, now=now)
    run.refresh_from_db()


def finish_stopped(run_id: int, token: str, holder: str) -> int:
    """Finish a stopped run whose driver (`holder`, with lease `token`) died; return 1, or 0 if it moved on."""
    changes = lost_changes(run_id)  # git, before the transaction
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, lease_token=token, status__in=ACTIVE).first()
        if run is None or run.cancel_requested_at is None:
            return 0
        asked = run.events.filter(kind="run.stop_requested").order_by("-seq").values_list("data", flat=True).first()
        who = (asked or {}).get("by") or "a person"
        finish_unheld(run, f"stopped by {who} in iteration {run.next_iteration}, whose worker had died", changes=changes)
    log.info("run %s: stopped; its driver %s had died", run_id, holder)
    return 1


def _lost_attempt(run_id: int, number: int) -> tuple[dict[str, Any], datetime] | None:
    """Return the start (data, time) of iteration `number` by the run's last claim, if it was neither
    recorded nor recorded lost since: an attempt its dead driver lost. Else None."""
    claimed = Event.objects.filter(run_id=run_id, kind="run.claimed").order_by("-seq").values_list("seq", flat=True)
    last = claimed.first()
    if last is None:
        return None
    since = Event.objects.filter(run_id=run_id, seq__gt=last)
    started = since.filter(kind="iteration.started", data__iteration=number).values_list("data", "created_at").first()
    if started is None or since.filter(kind="attempt.lost").exists():
        return None
    return started


def lost_changes(run_id: int) -> dict[str, Any] | None:
    """Ask what the run's lost attempt changed in the workspace since its iteration began (None: none was lost).

    Outside any transaction (a receiver of `signals.attempt_lost` runs git); its answer goes to
    `record_lost_attempt`.
    """
    run = Run.objects.select_related("instance").filter(pk=run_id).first()
    if run is None or _lost_attempt(run_id, run.next_iteration) is None:
        return None
    for _, answer in signals.attempt_lost.send(sender=Run, run=run, iteration=run.next_iteration):
        if answer is not None:
            return dict(answer)
    return {"unknown": "no snapshots of the workspace are kept"}


def record_lost_attempt(run: Run, worker: str, changes: dict[str, Any] | None) -> int:
    """Close what a dead driver left reserved and record the attempt it lost; return the micros closed.

    Inside the caller's transaction (the reaper, a claim taking over an expired lease, a stop of a
    run whose driver died). The reservations still held are settled at their reserved amount (the
    act may have spent it all) and charged to the run. If the driver had begun an iteration it
    never recorded, `attempt.lost` says so once: the worker, when, the reservations and the amount
    closed, what the workspace changed since the iteration began (`changes`, from `lost_changes`)
    and the tool calls the iteration journaled.
    """
    held = list(Reservation.objects.filter(run_id=run.pk, status=Reservation.Status.HELD).values_list("pk", flat=True))
    closed = ledger.close_abandoned(run)
    if closed:
        Run.objects.filter(pk=run.pk).update(spent_micros=F("spent_micros") + closed)
    number = run.next_iteration
    lost = _lost_attempt(run.pk, number)
    if lost is None:
        return closed
    started, began_at = lost
    changes = changes or {"unknown": "it was not looked at"}
    data: dict[str, Any] = {
        "iteration": number,
        "attempt": started.get("attempt") or 1,
        "worker": worker,
        "began_at": began_at.isoformat(),
        "lost_at": timezone.now().isoformat(),
        "reservations": held,
        "closed_usd": money.usd_string(closed),
    }
    if "unknown" in changes:
        data["changes_unknown"] = str(changes["unknown"])[:500]
    else:
        data.update(changed=changes.get("changed") or [], more=changes.get("more") or 0)
    data["tool_calls"] = journal.calls_of(run.pk, number)[:50]
    events.append(run.pk, "attempt.lost", data)
    log.warning("run %s: attempt %s of iteration %s was lost (worker %s)", run.pk, data["attempt"], number, worker)
    if tracing.enabled():  # its span died with its worker: the trace gets it from the record
        lost_at = datetime.fromisoformat(data["lost_at"])
        transaction.on_commit(lambda: tracing.iteration_lost(
            trace_ids(run), run.pk, number, data["attempt"], started=began_at, lost=lost_at, worker=worker
        ))
    return closed


def attempt_of(run: Run, number: int) -> int:
    """Return which start of iteration `number` this is: 2 and up when a dead worker's started it before."""
    if run.attempt <= 1:  # the first claim of this iteration: nothing started it before
        return 1
    return run.events.filter(kind="iteration.started", data__iteration=number).count() + 1


def interrupted(run: Run, number: int) -> str:
    """Tell a re-run what the lost attempt of its iteration left: "... it changed a.txt, b.py." ("" if none)."""
    lost = run.events.filter(kind="attempt.lost", data__iteration=number).order_by("-seq").values_list("data", flat=True)
    data = lost.first()
    if data is None:
        return ""
    return (
        f"A previous attempt of this iteration was interrupted; {changed_names(data)}. "
        "Look at what it left before you go on."
    )


def finish_run(
    run_id: int, token: str | None, outcome: str, detail: str, verified: bool | None = None,
    now: datetime | None = None, **extra: Any,
) -> Run | None:
    """The one place a run finishes: inside the caller's transaction, fenced by lease `token` (None: held by nobody).

    Writes the outcome and lets the lease go, appends `run.finished` and hands the run to
    `after_finish` (carve refund, lease return, receipt and notices after commit). Returns the
    finished run, or None when the fence failed (the run is not held with `token` any more).
    """
    done = Run.objects.filter(pk=run_id, lease_token=token).update(
        status=Run.Status.FINISHED,
        outcome=outcome,
        outcome_detail=detail,
        verified=verified,
        finished_at=now or timezone.now(),
        lease_token=None,
        lease_holder="",
        lease_expires_at=None,
        **extra,
    )
    if not done:
        return None
    run = Run.objects.get(pk=run_id)
    events.append(run.pk, "run.finished", finished_data(run))
    after_finish(run.pk)
    if tracing.enabled():
        transaction.on_commit(lambda: _traced_finish(run))
    return run


def trace_ids(run: Run) -> tracing.RunIds:
    """The run's trace ids, derived from it and its delegation root (`tether.tracing`)."""
    chain = [run]
    while chain[-1].parent_id is not None and len(chain) < 100:
        chain.append(Run.objects.only("pk", "created_at", "parent_id").get(pk=chain[-1].parent_id))
    parent = chain[1] if len(chain) > 1 else None
    return tracing.run_ids(
        tracing.run_key(run.pk, run.created_at),
        tracing.run_key(chain[-1].pk, chain[-1].created_at),
        tracing.run_key(parent.pk, parent.created_at) if parent else None,
    )


def _traced_finish(run: Run) -> None:
    tracing.run_finished(
        trace_ids(run), run.pk, started=run.started_at or run.created_at, finished=run.finished_at,
        attributes={
            "tether.outcome": run.outcome, "tether.verified": run.verified, "tether.iterations": run.iterations_done,
            "tether.cost_usd": run.spent_micros / 1_000_000, "tether.instance_id": run.instance_id,
        },
    )


def after_finish(run_id: int) -> None:
    """Once the transaction that finished the run (or parked it) commits, say so (receipt, review, notify).

    A finished child run's carve goes back to its parent first, inside that transaction, and the
    run's quota lease goes back to its pools' ancestors (a parked run spends nothing meanwhile).
    """
    delegation.refund_carve(run_id)
    ledger.return_run_lease(run_id)
    transaction.on_commit(lambda: signals.run_finished.send(sender=Run, run_id=run_id))


def finished_data(run: Run) -> dict[str, Any]:
    """`run.finished`'s payload: the outcome as the event has always named it, then a projection of `run_json`."""
    return {
        "outcome": run.outcome, "detail": run.outcome_detail,
        **selectors.run_json(run, ("verified", "iterations", "spent_usd")),
    }
