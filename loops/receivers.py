"""What the loop hears and registers, connected once by `LoopsConfig.ready` (`connect`).

The driver on each django-q2 worker, the ledger's hook on a deleted run, the delegation's receivers
of a child run's start and end, the composition's role check among the graders, and the vetting of
a brain's `delegate` call.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import pre_delete
from django_q.signals import post_spawn

from budgets import services
from instances.brains import base
from loops import delegation, driver, grading, signals
from loops.models import Run


def _run_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    services.close_deleted_run(instance)


def connect() -> None:
    """Connect the receivers and register the role check (once: a second call is refused)."""
    # Every django-q2 worker process hosts one driver: a pool of threads that
    # drive claimed runs, a heartbeat that renews their leases and watches for
    # stop requests, and the reaper.
    post_spawn.connect(driver.on_worker_spawn, dispatch_uid="tether-driver")
    # A run deleted while its pools hold money for it releases that money (the ledger's hook).
    pre_delete.connect(_run_deleted, sender=Run, dispatch_uid="budgets.run_deleted")
    # A child run's start and end are told on its parent's timeline; its end may resume the parent.
    signals.run_starting.connect(delegation.on_run_starting, dispatch_uid="tether-delegation-start")
    signals.run_finished.connect(delegation.on_run_finished, dispatch_uid="tether-delegation")
    # A composition's done is verified only with its verifying role's pass (the first grader).
    grading.register("composition-role", delegation.role_check, order=grading.ROLE)
    # A brain's `delegate` call is vetted at once, so a refusal is that call's own tool result.
    base.on_delegate(delegation.check_in_act)
