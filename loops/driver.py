"""The per-process driver: threads that drive claimed runs, pickup, a heartbeat, the reaper.

One driver lives in each worker process. Acts are I/O-bound, so a thread per
claimed run lets one process hold hundreds of live runs; every thread is fenced
by its own lease. A run reaches a driver two ways: its queue task (`tasks.drive`,
one run), and the driver's pickup, which claims the runs waiting for a driver in
batches while the process has room (`leases.claim_due`), so a flood of runs
started at once does not wait for one queue task each. The heartbeat renews this
process's leases (all in one transaction), turns stop requests into stop signals for
acts in flight (so a stop lands within a second even mid-act), and runs the reaper, which
re-schedules runs whose driver died. A transient database error in any of it is retried on
the next tick with a fresh connection. The beat (`loops.liveness`: a stop need not wait for a
dead holder's lease, and the reaper leaves a live one's run) has a thread of its own that
never touches the database, and beats at once when a run is claimed: a heartbeat waiting
on a busy database is a live driver, and must not look like a dead one.

A worker process that stops cleanly (django-q2 hands each worker a STOP when its cluster gets
SIGTERM or SIGINT: `serve`'s Ctrl-C) hands back every lease its driver holds as it exits
(`shutdown`, run by multiprocessing's exit finalizers), so the run's next act starts on another
worker, or the restarted one, at once instead of after its lease expires. A killed one is the reaper's.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
import socket
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from loops import delegation, events, leases, lifecycle, liveness, runner, tasks
from loops.models import Run
from tether import dbfaults, dbpool, jsonlog
from tether.perprocess import PerProcess

log = logging.getLogger(__name__)

# Runs one pickup claims at most: a flood is shared among the processes that poll.
PICKUP_BATCH = 100
# How often a driver says it lives (TETHER_HOLDER_SILENT_SECONDS of silence is a death).
BEAT_SECONDS = 1.0
# (what, run id) of the runs a pass failed to handle: each is logged in full once, not on every pass.
_failing: set[tuple[str, int]] = set()


def get() -> Driver:
    """Return this process's driver, starting it on first use."""
    return _driver.get()


def on_worker_spawn(sender=None, proc_name=None, **kwargs) -> None:
    """django-q2's post_spawn, sent by each new worker process: pool its connections, start its driver."""
    dbpool.enable()
    driver = get()
    # Run as the worker process exits after django-q2's STOP (its `_bootstrap` runs these finalizers;
    # atexit handlers never run in a forked child). A worker killed by a signal runs nothing: the reaper.
    multiprocessing.util.Finalize(driver, driver.shutdown, exitpriority=100)


class Driver:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = f"{socket.gethostname()}:{self.pid}"
        self.capacity = settings.TETHER_RUNS_PER_WORKER
        self.leases: dict[int, leases.Lease] = {}
        self.pending = 0
        self.connection_slots = threading.BoundedSemaphore(settings.TETHER_CONNECTIONS_PER_WORKER)
        self.db_gate = threading.BoundedSemaphore(settings.TETHER_DB_GATE_PER_WORKER)
        self.lock = threading.Lock()
        self.stopping = False
        self.beating = threading.Thread(target=self._beating, name="tether-beat", daemon=True)
        self.beating.start()
        self.heartbeat = threading.Thread(target=self._heartbeat, name="tether-heartbeat", daemon=True)
        self.heartbeat.start()
        self.pickup = threading.Thread(target=self._pickup, name="tether-pickup", daemon=True)
        self.pickup.start()

    # --- driving -----------------------------------------------------------------

    def submit(self, run_id: int, iteration: int) -> bool:
        """Drive the run in a thread of its own; False when this process is full."""
        with self.lock:
            if self.stopping:
                return False  # this process is exiting: its shutdown handed the run back (or never held it)
            if len(self.leases) + self.pending >= self.capacity:
                log.warning("driver %s full (%s runs); run %s waits for the reaper", self.name, self.capacity, run_id)
                return False
            self.pending += 1
        self._start(run_id, iteration, None)
        return True

    def _pickup(self) -> None:
        """Claim runs waiting for a driver, a batch at a time, while this process has room.

        Between batches it sleeps a poll, so the other processes polling get their share of a
        flood. A run's queue task that comes later finds it taken and exits. A database error
        is retried on the next poll with a new connection.
        """
        while True:
            time.sleep(settings.TETHER_PICKUP_POLL_SECONDS)
            with self.lock:
                if self.stopping:
                    return
                room = min(PICKUP_BATCH, self.capacity - len(self.leases) - self.pending)
                if room <= 0:
                    continue
                self.pending += room
            claimed: list[tuple[leases.Lease, int]] = []
            try:
                claimed = leases.claim_due(self.name, room)
            except Exception as exc:
                log.warning("driver %s: pickup failed (%s); retrying on a new connection", self.name, exc)
                connection.close()
            finally:
                with self.lock:
                    self.pending -= room
                    self.leases.update((lease.run_id, lease) for lease, _ in claimed)
            if claimed:
                self._beat()
            for lease, iteration in claimed:
                try:
                    self._start(lease.run_id, iteration, lease)
                except Exception:  # (no thread to drive it) the lease is not renewed: the reaper re-schedules it
                    log.exception("run %s: driver %s could not start driving it", lease.run_id, self.name)
                    with self.lock:
                        if self.leases.get(lease.run_id) is lease:
                            del self.leases[lease.run_id]

    def _start(self, run_id: int, iteration: int, lease: leases.Lease | None) -> None:
        threading.Thread(
            target=self._drive, args=(run_id, iteration, lease), name=f"tether-run-{run_id}", daemon=True
        ).start()

    def _drive(self, run_id: int, iteration: int, lease: leases.Lease | None) -> None:
        """Drive the run under `lease`, or (a queue task's run) claim it first."""
        jsonlog.bind(run_id=run_id, iteration=iteration, worker=self.name)  # every line of this thread
        slot = self.connection_slots.acquire(blocking=False)
        try:
            if lease is None:
                try:
                    lease = leases.claim(run_id, iteration, self.name)
                finally:
                    with self.lock:
                        self.pending -= 1
                        if lease is not None:
                            self.leases[run_id] = lease
                if lease is not None:
                    self._beat()
            if lease is not None:
                lease.keeps_connection = slot
                if not slot and connection.vendor == "postgresql":
                    lease.gate = self.db_gate  # SQLite connections are a file handle: no bound needed
                runner.drive(lease)
        except Exception:
            log.exception("run %s: driver failed; the reaper will re-schedule it", run_id)
        finally:
            with self.lock:
                if lease is not None and self.leases.get(run_id) is lease:
                    del self.leases[run_id]
            if slot:
                self.connection_slots.release()
            connection.close()

    def shutdown(self, wait: float = 5.0) -> int:
        """Hand back every lease this driver holds (the process is stopping cleanly); return how many.

        Claims stop first, and one in flight is waited for (at most `wait` s) so that what it takes is
        handed back too. The runs' threads are not told: they die with the process, and a write one
        makes meanwhile is fenced out by the lease it no longer holds. What an act in flight did is
        lost as an attempt, recorded as the reaper records one (`leases.release`).
        """
        if self.pid != os.getpid():
            return 0  # a copy inherited by a forked child: the leases are its parent's
        with self.lock:
            self.stopping = True
        ends = time.monotonic() + wait
        while time.monotonic() < ends:
            with self.lock:
                if not self.pending:
                    break
            time.sleep(0.02)
        with self.lock:
            held = list(self.leases.values())
        released = 0
        for lease in held:
            try:
                released += leases.release(lease)
                with self.lock:
                    if self.leases.get(lease.run_id) is lease:
                        del self.leases[lease.run_id]  # no longer beaten for
            except Exception:  # its lease expires as a killed driver's would: the reaper takes it
                log.exception("run %s: driver %s could not hand back its lease", lease.run_id, self.name)
        log.info("driver %s stopping: handed back %s of %s run(s)", self.name, released, len(held))
        connection.close()
        return released

    # --- beat and heartbeat ---------------------------------------------------------

    def _beat(self) -> None:
        try:
            with self.lock:
                runs = list(self.leases)
            liveness.beat(self.name, runs)
        except Exception:  # the cache is down: stops then wait for the lease, as they always could
            log.warning("driver %s: cannot record its beat", self.name, exc_info=True)

    def _beating(self) -> None:
        while True:
            self._beat()
            time.sleep(BEAT_SECONDS)

    def _heartbeat(self) -> None:
        last_renew = last_reap = time.monotonic()
        while True:
            time.sleep(settings.TETHER_STOP_POLL_SECONDS)
            try:
                close_old_connections()
                now = time.monotonic()
                with self.lock:
                    held = dict(self.leases)
                sweep_stops()
                if held:
                    self._signal_stops(held)
                    if now - last_renew >= settings.TETHER_LEASE_SECONDS / 3:
                        self._renew(held)
                        last_renew = now
                if now - last_reap >= settings.TETHER_REAPER_SECONDS:
                    reap()
                    last_reap = now
            except Exception as exc:
                # A cut connection heals on the next tick: close it, and renew and reap then
                # (the lease outlives a few missed ticks; `last_renew` was not moved).
                if dbfaults.is_transient(exc):
                    log.warning("driver heartbeat: transient database error (%s); retrying on a new connection", exc)
                else:
                    log.warning("driver heartbeat failed; retrying", exc_info=True)
                connection.close()

    def _signal_stops(self, held: dict[int, leases.Lease]) -> None:
        stopped = Run.objects.filter(pk__in=list(held), cancel_requested_at__isnull=False).values_list(
            "pk", flat=True
        )
        for run_id in stopped:
            held[run_id].stop.set()

    def _renew(self, held: dict[int, leases.Lease]) -> None:
        renewed = leases.renew(list(held.values()))
        for run_id, lease in held.items():
            if run_id not in renewed:
                lease.stop.set()  # lost or finished: an act still in flight must end


_driver = PerProcess(Driver)


def failed(what: str, run_id: int, exc: Exception) -> None:
    """Log that `what` failed for run `run_id`, in full the first time; re-raise a transient database error.

    For a pass over many runs (the reaper, the stop sweep), called in the `except` around one run's
    handling: the fault is that run's, and the pass goes on. A transient database error is the
    pass's, not the run's: raised, it ends the pass, retried on the next tick with a new connection.
    """
    if dbfaults.is_transient(exc):
        raise exc
    if (what, run_id) in _failing:
        log.debug("run %s: %s failed again: %s", run_id, what, exc)
        return
    _failing.add((what, run_id))
    log.exception("run %s: %s failed; the other runs go on (logged once for this run)", run_id, what)


def sweep_stops() -> int:
    """Finish the runs a person stopped whose driver died (a stop never waits for their leases).

    `run_cancel` finishes such a run itself when it can tell the holder is dead; this catches
    a holder that died just after (or was not yet known dead then). Return how many.
    """
    stopped = list(
        Run.objects.filter(status__in=lifecycle.ACTIVE, cancel_requested_at__isnull=False, lease_token__isnull=False)
        .values_list("pk", "lease_token", "lease_holder")[:200]
    )
    finished = 0
    for run_id, token, holder in stopped:
        try:
            if holder and liveness.holder_gone(holder):
                finished += lifecycle.finish_stopped(run_id, token, holder)
        except Exception as exc:
            failed("finishing it as stopped", run_id, exc)
    return finished


def reap(limit: int = 200) -> int:
    """Re-schedule active runs whose lease or pickup deadline passed; return how many."""
    now = timezone.now()
    stale = list(
        Run.objects.filter(status__in=lifecycle.ACTIVE)
        .filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
        .values_list("pk", "lease_expires_at", "lease_holder", "next_iteration")[:limit]
    )
    reaped = 0
    patience = timedelta(seconds=settings.TETHER_DB_RETRY_SECONDS)
    for run_id, expired, holder, iteration in stale:
        try:
            if holder and expired is not None and now - expired < patience and liveness.still_driving(holder, run_id):
                continue  # its driver lives and drives it: renewals lost to a cut connection, not a death
            changes = lifecycle.lost_changes(run_id) if holder else None  # git, before the transaction
            with transaction.atomic():
                taken = Run.objects.filter(pk=run_id, lease_expires_at=expired, status__in=lifecycle.ACTIVE).update(
                    lease_token=None, lease_holder="", lease_expires_at=tasks.pickup_deadline()
                )
                if not taken:
                    continue
                lifecycle.record_lost_attempt(Run.objects.get(pk=run_id), holder, changes)
                events.append(run_id, "run.reaped", {"iteration": iteration, "previous_worker": holder})
                tasks.schedule(run_id, iteration)
                reaped += 1
        except Exception as exc:
            failed("re-scheduling it", run_id, exc)
    reaped += delegation.check_parked()
    if reaped:
        log.info("reaper re-scheduled %s run(s)", reaped)
    return reaped
