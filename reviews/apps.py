from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Reviews, receipts and audit"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from budgets.signals import threshold_crossed
        from loops.models import Run
        from reviews import notify

        # A pool crossing its soft threshold is one of the things people are told about.
        threshold_crossed.connect(notify.on_threshold_crossed, dispatch_uid="reviews.threshold_crossed")
        post_delete.connect(_forget_snapshots, sender=Run, dispatch_uid="reviews.run_deleted")


def _forget_snapshots(sender, instance, **kwargs) -> None:
    # A deleted run's workspace snapshots go with it (once the deletion commits).
    import shutil

    from django.db import transaction

    from reviews.snapshots import git_dir

    path = git_dir(instance.pk)
    transaction.on_commit(lambda: shutil.rmtree(path, ignore_errors=True))
