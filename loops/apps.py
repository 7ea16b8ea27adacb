from typing import Any

from django.apps import AppConfig
from django.db.models.signals import pre_delete


def _run_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    from budgets import services  # lazy: apps.py is imported before the models it reaches are loaded

    services.close_deleted_run(instance)


class LoopsConfig(AppConfig):
    name = "loops"

    def ready(self) -> None:
        from django_q.signals import post_spawn  # lazy: it imports django_q's models, not loaded until now

        from instances.brains import base  # lazy: models load before ready(), not before apps.py
        from loops import (  # lazy: models load before ready(), not before apps.py
            delegation,
            driver,
            grading,
            signals,
        )
        from loops.models import Run  # lazy: models load before ready(), not before apps.py

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
