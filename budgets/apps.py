from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    name = "budgets"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from loops.models import Run

        pre_delete.connect(_close_reservations_of_deleted_run, sender=Run, dispatch_uid="budgets.run_deleted")


def _close_reservations_of_deleted_run(sender, instance, **kwargs) -> None:
    # No reservation outlives its run: a run deleted while money is held settles it conservatively.
    from budgets import ledger

    ledger.close_abandoned(instance, actor="run deleted")
    ledger.return_run_lease(instance.pk, actor="run deleted")
