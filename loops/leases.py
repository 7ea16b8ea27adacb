"""Who drives a run: its lease — claimed, renewed, handed back, released — and a finish under it.

A driver holds a run by its lease token, and every write of the runner is fenced by it. `claim`
and `claim_due` take leases (a dead driver's expired one too, recording the attempt it lost),
`renew` extends a driver's leases in one transaction, `hand_back` returns a run to the queue when
a slice ends, `release` lets it go when the driver stops cleanly, and `finish` ends the run the
lease holds (`lifecycle.finish_run`, fenced: `LeaseLost` when the lease is gone). A transient
database error in a claim or a hand-back is retried on a fresh connection (`tether.dbfaults`).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from budgets import ledger
from loops import events, lifecycle, tasks
from loops.models import Run
from tether import dbfaults


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
    # The seq of this lease's `run.claimed` event: what this driver wrote comes after it.
    claimed_seq: int = 0

    def enter(self) -> None:
        """Before the driver writes: pass the process's gate (when it has one) and hold a connection."""
        if self.gate is not None and not self.gate_held:
            # With a pool, wait holding no connection: the runs waiting here must not hold what the
            # runs let in need.
            dbfaults.give_back()
            self.gate.acquire()
            self.gate_held = True
        dbfaults.hold_no_connection(False)

    def leave(self) -> None:
        """Give the gate back (closing the connection it let this run hold), if it holds it."""
        if self.gate_held:
            connection.close()
            self.gate_held = False
            assert self.gate is not None
            self.gate.release()


def lease_seconds() -> timedelta:
    return timedelta(seconds=settings.TETHER_LEASE_SECONDS)


def renew(leases: list[Lease]) -> set[int]:
    """Extend a driver's leases for another `lease_seconds`; return the runs whose lease it still holds.

    One short transaction renews them all, however many: it takes the rows still under their
    tokens that no other transaction holds (SKIP LOCKED on PostgreSQL, so it never waits on a
    run mid-iteration, and never deadlocks with one; SQLite's one writer makes the read and the
    write one step) and extends them with one UPDATE. A run it skipped — locked by its own
    iteration, or its token gone — is renewed by a statement of its own, and one whose token is
    gone is not returned: the driver must stop it. An expiry counts from when its row is
    written, never from before a wait for its lock: renewed after a wait longer than the lease,
    it would be written already expired, and the reaper would take a run its driver still drives.
    """
    if not leases:
        return set()
    tokens = {lease.run_id: lease.token for lease in leases}
    with transaction.atomic():  # SQLite: waits here for the writer's lock
        rows = Run.objects.filter(pk__in=list(tokens)).select_for_update(skip_locked=True)
        free = [pk for pk, token in rows.values_list("pk", "lease_token") if token == tokens[pk]]
        if free:
            Run.objects.filter(pk__in=free).update(lease_expires_at=timezone.now() + lease_seconds())
    renewed = set(free)
    for lease in leases:
        if lease.run_id not in renewed and _renew_one(lease):
            renewed.add(lease.run_id)
    return renewed


def _renew_one(lease: Lease) -> bool:
    """Renew one lease whose row another transaction held: wait for it, then extend from now."""
    with transaction.atomic():
        mine = Run.objects.filter(pk=lease.run_id, lease_token=lease.token)
        if not mine.select_for_update().exists():
            return False
        return bool(mine.update(lease_expires_at=timezone.now() + lease_seconds()))


def claim_due(holder: str, limit: int) -> list[tuple[Lease, int]]:
    """Claim up to `limit` runs waiting for a driver, longest waiting first; return (lease, iteration) pairs.

    A run waits for a driver when it is active and unleased: started, handed back, resumed or
    reaped. (A run whose lease merely expired is the reaper's: it gives a live holder time to
    reconnect and closes what a dead one reserved; then the run is unleased and waits here.)
    One transaction takes them as `claim` takes one — a new token each, attempt + 1,
    `run.claimed` — in a few statements however many they are; a run past
    TETHER_MAX_ATTEMPTS goes through `claim`, which ends it `crashed`. On PostgreSQL the
    rows are locked with SKIP LOCKED, so drivers claiming at once take different runs
    without waiting; on SQLite the transaction is IMMEDIATE, so claims are serialised.
    """
    waiting = Run.objects.filter(status__in=lifecycle.ACTIVE, lease_token__isnull=True)
    claimed: list[tuple[Lease, int]] = []

    def once() -> list[tuple[Lease, int]]:
        if claimed:  # the connection died; maybe after the claims had committed (all or none)
            if Run.objects.filter(lease_token__in=[lease.token for lease, _ in claimed]).exists():
                return list(claimed)
            claimed.clear()
        if not waiting.exists():  # nothing waits: a read, no write lock
            return []
        now = timezone.now()
        with transaction.atomic():
            due = list(
                waiting.select_for_update(skip_locked=True)
                .order_by("lease_expires_at", "pk")
                .values_list("pk", "next_iteration", "attempt")[:limit]
            )
            for run_id, iteration, attempt in due:
                if attempt >= settings.TETHER_MAX_ATTEMPTS:
                    claim(run_id, iteration, holder)  # its last attempt is spent: this ends it crashed
            fresh = {
                run_id: (iteration, attempt + 1, secrets.token_hex(16))
                for run_id, iteration, attempt in due
                if attempt < settings.TETHER_MAX_ATTEMPTS
            }
            if not fresh:
                return []
            # The rows are this transaction's (locked, or SQLite's one writer): set-wise, not one by one.
            Run.objects.filter(pk__in=list(fresh), status__in=lifecycle.ACTIVE, lease_token__isnull=True).update(
                lease_token=Case(*(When(pk=run_id, then=Value(token)) for run_id, (_, _, token) in fresh.items())),
                lease_holder=holder,
                lease_expires_at=now + lease_seconds(),
                attempt=F("attempt") + 1,
                status=Run.Status.RUNNING,
            )
            Run.objects.filter(pk__in=list(fresh), started_at__isnull=True).update(started_at=now)
            seqs = events.append_to_each(
                "run.claimed",
                {run_id: {"iteration": it, "worker": holder, "attempt": n} for run_id, (it, n, _) in fresh.items()},
            )
            claimed.extend(
                (Lease(run_id, token, holder, claimed_seq=seqs[run_id]), iteration)
                for run_id, (iteration, _, token) in fresh.items()
            )
        return list(claimed)

    return dbfaults.retry(once, what="claim waiting runs")


def claim(run_id: int, iteration: int, holder: str) -> Lease | None:
    """Take the run's lease for `iteration`; None when someone else has it or it moved on."""
    token = secrets.token_hex(16)
    tries = 0

    def once() -> Lease | None:
        nonlocal tries
        tries += 1
        if tries > 1:  # the connection died; maybe after the claim had committed
            seq = Run.objects.filter(pk=run_id, lease_token=token).values_list("last_seq", flat=True).first()
            if seq is not None:
                return Lease(run_id, token, holder, claimed_seq=seq)
        return _claim(run_id, iteration, holder, token, _expired(run_id, iteration))

    return dbfaults.retry(once, what=f"run {run_id}: claim")


class _Expired(NamedTuple):
    """A dead driver's lease a claim takes over, and what its lost attempt changed (asked before)."""

    token: str
    holder: str
    changes: dict[str, Any] | None


def _expired(run_id: int, iteration: int) -> _Expired | None:
    """Return the expired lease a claim of `iteration` would take over (the reaper had not yet), else None."""
    held = (
        Run.objects.filter(pk=run_id, next_iteration=iteration, status__in=lifecycle.ACTIVE, lease_token__isnull=False)
        .filter(lease_expires_at__lt=timezone.now())
        .values_list("lease_token", "lease_holder")
        .first()
    )
    if held is None:
        return None
    return _Expired(held[0], held[1], lifecycle.lost_changes(run_id))


def _claim(run_id: int, iteration: int, holder: str, token: str, expired: _Expired | None) -> Lease | None:
    now = timezone.now()
    # Free, or the expired lease looked at before (whose lost attempt is recorded here).
    free = Q(lease_token=expired.token, lease_expires_at__lt=now) if expired else Q(lease_token__isnull=True)
    with transaction.atomic():
        taken = (
            Run.objects.filter(pk=run_id, next_iteration=iteration, status__in=lifecycle.ACTIVE)
            .filter(free)
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
        if expired is not None:
            lifecycle.record_lost_attempt(run, expired.holder, expired.changes)  # before this claim's event
        seq = events.append(run_id, "run.claimed", {"iteration": iteration, "worker": holder, "attempt": run.attempt})
        lease = Lease(run_id, token, holder, claimed_seq=seq)
        if run.attempt > settings.TETHER_MAX_ATTEMPTS:  # what the last one left was closed with its loss
            detail = (
                f"iteration {iteration} was started {run.attempt - 1} times and never finished "
                f"(its worker died each time); giving up after {settings.TETHER_MAX_ATTEMPTS} attempts"
            )
            finish(lease, Run.Outcome.CRASHED, detail)
            return None
    return lease


def hand_back(lease: Lease) -> None:
    """Release the run to the queue at its next iteration (a slice ended), returning its quota lease."""
    def once() -> None:
        with transaction.atomic():
            run = Run.objects.filter(pk=lease.run_id, lease_token=lease.token).first()
            if run is None:
                return  # not ours any more (or this hand-back committed before the connection died)
            Run.objects.filter(pk=run.pk, lease_token=lease.token).update(
                lease_token=None, lease_holder="", lease_expires_at=timezone.now() + lease_seconds(), attempt=0
            )
            # Its ancestors book what it spent this slice of time (in this period, not the one it ends in).
            ledger.return_run_lease(run.pk)
            tasks.schedule(run.pk, run.next_iteration)

    dbfaults.retry(once, what=f"run {lease.run_id}: hand back")


def release(lease: Lease, reason: str = "its worker stopped") -> bool:
    """Hand a lease back at once when its driver stops cleanly; return whether it was still held.

    As the reaper does for a dead driver, but without waiting for the lease to expire: what the
    driver had reserved is closed, an iteration it began and did not record is an `attempt.lost`,
    and the run waits for a driver (this process's next start, or another) with a drive task queued.
    """
    changes = lifecycle.lost_changes(lease.run_id)  # git, before the transaction
    with transaction.atomic():
        run = Run.objects.filter(pk=lease.run_id, lease_token=lease.token, status__in=lifecycle.ACTIVE).first()
        if run is None or not Run.objects.filter(pk=run.pk, lease_token=lease.token).update(
            lease_token=None, lease_holder="", lease_expires_at=tasks.pickup_deadline()
        ):
            return False  # finished, or not ours any more
        lifecycle.record_lost_attempt(run, lease.holder, changes)
        events.append(
            run.pk, "run.released", {"iteration": run.next_iteration, "previous_worker": lease.holder, "reason": reason}
        )
        tasks.schedule(run.pk, run.next_iteration)
    return True


def finish(lease: Lease, outcome: str, detail: str, verified: bool | None = None, **extra: Any) -> None:
    """Finish the run the lease holds (inside the caller's transaction): `lifecycle.finish_run`, fenced; else `LeaseLost`."""
    if lifecycle.finish_run(lease.run_id, lease.token, outcome, detail, verified, **extra) is None:
        raise LeaseLost
