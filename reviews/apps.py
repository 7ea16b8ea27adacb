from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Reviews, receipts and audit"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from budgets.signals import threshold_crossed
        from loops import signals as loop_signals
        from loops.models import Run
        from reviews import graders, notify

        # A pool crossing its soft threshold is one of the things people are told about.
        threshold_crossed.connect(notify.on_threshold_crossed, dispatch_uid="reviews.threshold_crossed")
        post_delete.connect(_forget_snapshots, sender=Run, dispatch_uid="reviews.run_deleted")
        # The loop does not import reviews: it says when a run starts, proposes done and finishes.
        loop_signals.run_starting.connect(_snapshot_start, sender=Run, dispatch_uid="reviews.run_starting")
        loop_signals.done_proposed.connect(graders.on_done_proposed, sender=Run, dispatch_uid="reviews.grade")
        loop_signals.run_finished.connect(_run_finished, sender=Run, dispatch_uid="reviews.run_finished")
        # ... and when an iteration begins, and what a lost attempt of it changed.
        loop_signals.iteration_starting.connect(_mark_iteration, sender=Run, dispatch_uid="reviews.iteration")
        loop_signals.attempt_lost.connect(_lost_changes, sender=Run, dispatch_uid="reviews.attempt_lost")
        # ... and when its stall handling rewinds the workspace: the rollback's owner restores it.
        loop_signals.rewind_requested.connect(_rewind, sender=Run, dispatch_uid="reviews.rewind")


def _snapshot_start(sender, run, **kwargs) -> None:
    # The workspace as the run found it: the review's diff starts here (once no rollback is writing it).
    from reviews import rollback, snapshots

    rollback.wait_for_rollback(run)
    snapshots.take(run)


def _mark_iteration(sender, run, number, **kwargs) -> None:
    # The workspace as the iteration's first attempt found it, once no rollback is writing it.
    from reviews import rollback, snapshots

    rollback.wait_for_rollback(run)
    snapshots.mark_iteration(run, number)


def _lost_changes(sender, run, iteration, **kwargs):
    from reviews import snapshots

    return snapshots.changed_since_iteration(run, iteration)


def _rewind(sender, run, token, to, iteration, **kwargs):
    # The run itself, under its own lease, back to the state its iteration `to` left the workspace in.
    from loops.services import Refused
    from reviews import rollback

    try:
        done = rollback.rewind(run=run, token=token, to=to, stall=iteration)
    except Refused as exc:
        return {"refused": exc.message}
    return {
        "rewound": {
            "label": done.point.label, "undo": done.undo, "exact": done.exact, "added": len(done.added),
            "modified": len(done.modified), "deleted": len(done.deleted), "not_restored": done.not_restored[:20],
        }
    }


def _run_finished(sender, run_id, **kwargs) -> None:
    # Receipt, review queue and notifications (never raises).
    from reviews import services

    services.on_run_finished(run_id)


def _forget_snapshots(sender, instance, **kwargs) -> None:
    # A deleted run's workspace snapshots go with it (once the deletion commits).
    import shutil

    from django.db import transaction

    from reviews.snapshots import git_dir

    path = git_dir(instance.pk)
    transaction.on_commit(lambda: shutil.rmtree(path, ignore_errors=True))
