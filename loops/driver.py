"""The per-process driver: threads that drive claimed runs, a heartbeat, the reaper.

One driver lives in each worker process. Acts are I/O-bound, so a thread per
claimed run lets one process hold hundreds of live runs; every thread is fenced
by its own lease. The heartbeat renews this process's leases, turns stop requests
into stop signals for acts in flight (so a stop lands within a second even
mid-act), and runs the reaper, which re-schedules runs whose driver died.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from loops import runner
from tether import jsonlog

log = logging.getLogger(__name__)

_driver: Driver | None = None
_driver_lock = threading.Lock()


def get() -> Driver:
    """Return this process's driver, starting it on first use."""
    global _driver
    with _driver_lock:
        if _driver is None or _driver.pid != os.getpid():
            _driver = Driver()
        return _driver


def on_worker_spawn(sender=None, proc_name=None, **kwargs) -> None:
    """django-q2's post_spawn, sent by each new worker process: start its driver."""
    get()


class Driver:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = f"{socket.gethostname()}:{self.pid}"
        self.capacity = settings.TETHER_RUNS_PER_WORKER
        self.leases: dict[int, runner.Lease] = {}
        self.pending = 0
        self.connection_slots = threading.BoundedSemaphore(settings.TETHER_CONNECTIONS_PER_WORKER)
        self.db_gate = threading.BoundedSemaphore(settings.TETHER_DB_GATE_PER_WORKER)
        self.lock = threading.Lock()
        self.heartbeat = threading.Thread(target=self._heartbeat, name="tether-heartbeat", daemon=True)
        self.heartbeat.start()

    # --- driving -----------------------------------------------------------------

    def submit(self, run_id: int, iteration: int) -> bool:
        """Drive the run in a thread of its own; False when this process is full."""
        with self.lock:
            if len(self.leases) + self.pending >= self.capacity:
                log.warning("driver %s full (%s runs); run %s waits for the reaper", self.name, self.capacity, run_id)
                return False
            self.pending += 1
        threading.Thread(
            target=self._drive, args=(run_id, iteration), name=f"tether-run-{run_id}", daemon=True
        ).start()
        return True

    def _drive(self, run_id: int, iteration: int) -> None:
        jsonlog.bind(run_id=run_id, iteration=iteration, worker=self.name)  # every line of this thread
        lease = None
        slot = self.connection_slots.acquire(blocking=False)
        try:
            try:
                lease = runner.claim(run_id, iteration, self.name)
            finally:
                with self.lock:
                    self.pending -= 1
                    if lease is not None:
                        self.leases[run_id] = lease
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

    # --- heartbeat -----------------------------------------------------------------

    def _heartbeat(self) -> None:
        last_renew = last_reap = time.monotonic()
        while True:
            time.sleep(settings.TETHER_STOP_POLL_SECONDS)
            try:
                close_old_connections()
                now = time.monotonic()
                with self.lock:
                    leases = dict(self.leases)
                if leases:
                    self._signal_stops(leases)
                    if now - last_renew >= settings.TETHER_LEASE_SECONDS / 3:
                        self._renew(leases)
                        last_renew = now
                if now - last_reap >= settings.TETHER_REAPER_SECONDS:
                    reap()
                    last_reap = now
            except Exception:
                log.warning("driver heartbeat failed; retrying", exc_info=True)
                connection.close()

    def _signal_stops(self, leases: dict[int, runner.Lease]) -> None:
        from loops.models import Run

        stopped = Run.objects.filter(pk__in=list(leases), cancel_requested_at__isnull=False).values_list(
            "pk", flat=True
        )
        for run_id in stopped:
            leases[run_id].stop.set()

    def _renew(self, leases: dict[int, runner.Lease]) -> None:
        from loops.models import Run

        # One row per statement: a multi-row UPDATE locks rows in heap order while it waits, and
        # deadlocks with iteration transactions that hold their run row and wait for a pool row.
        expires = timezone.now() + runner.lease_seconds()
        for lease in leases.values():
            if not Run.objects.filter(pk=lease.run_id, lease_token=lease.token).update(lease_expires_at=expires):
                lease.stop.set()  # lost or finished: an act still in flight must end


def reap(limit: int = 200) -> int:
    """Re-schedule active runs whose lease or pickup deadline passed; return how many."""
    from loops import events, tasks
    from loops.models import Run

    now = timezone.now()
    stale = list(
        Run.objects.filter(status__in=runner.ACTIVE)
        .filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
        .values_list("pk", "lease_expires_at", "lease_holder", "next_iteration")[:limit]
    )
    reaped = 0
    for run_id, expired, holder, iteration in stale:
        with transaction.atomic():
            taken = Run.objects.filter(pk=run_id, lease_expires_at=expired, status__in=runner.ACTIVE).update(
                lease_token=None, lease_holder="", lease_expires_at=tasks.pickup_deadline()
            )
            if not taken:
                continue
            runner.charge_abandoned(Run.objects.get(pk=run_id))
            events.append(run_id, "run.reaped", {"iteration": iteration, "previous_worker": holder})
            tasks.schedule(run_id, iteration)
            reaped += 1
    if reaped:
        log.info("reaper re-scheduled %s run(s)", reaped)
    return reaped
