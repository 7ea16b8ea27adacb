"""django-q2 entry points: they take ids and hand the run to this process's driver."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from django_q.tasks import async_task

from loops import driver


def drive(run_id: int, iteration: int) -> None:
    """Drive run `run_id` from `iteration` (a duplicate or stale task claims nothing)."""
    driver.get().submit(run_id, iteration)


def schedule(run_id: int, iteration: int) -> None:
    """Enqueue a drive task. Inside a transaction, it commits or vanishes with it (ORM broker).

    The run's pickup deadline is set by the caller (its lease expiry); if no worker
    claims the run by then, a reaper schedules it again.
    """
    async_task("loops.tasks.drive", run_id, iteration, task_name=f"run-{run_id}-{iteration}", group="drive")


def pickup_deadline():
    return timezone.now() + timedelta(seconds=settings.TETHER_LEASE_SECONDS)
