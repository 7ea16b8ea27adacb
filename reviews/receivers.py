"""What reviews hears from the apps below it, connected once by `ReviewsConfig.ready` (`connect`).

The loop does not import reviews: it says when a run starts, when an iteration begins, what a lost
attempt changed and when a run finishes (`loops.signals`), and it asks its registered graders of a
proposed done (`loops.grading`), where `reviews.graders.on_done_proposed` comes after the
composition's role check.
"""

from __future__ import annotations

import shutil
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete

from budgets.signals import threshold_crossed
from loops import grading
from loops import signals as loop_signals
from loops.models import Run
from loops.services import Refused
from reviews import graders, notify, rollback, services, snapshots


def connect() -> None:
    """Connect the receivers and register the configured grader (once: a second call is refused)."""
    # A pool crossing its soft threshold is one of the things people are told about.
    threshold_crossed.connect(notify.on_threshold_crossed, dispatch_uid="reviews.threshold_crossed")
    post_delete.connect(forget_snapshots, sender=Run, dispatch_uid="reviews.run_deleted")
    loop_signals.run_starting.connect(snapshot_start, sender=Run, dispatch_uid="reviews.run_starting")
    loop_signals.run_finished.connect(run_finished, sender=Run, dispatch_uid="reviews.run_finished")
    # ... and when an iteration begins, and what a lost attempt of it changed.
    loop_signals.iteration_starting.connect(mark_iteration, sender=Run, dispatch_uid="reviews.iteration")
    loop_signals.attempt_lost.connect(lost_changes, sender=Run, dispatch_uid="reviews.attempt_lost")
    # ... and when its stall handling rewinds the workspace: the rollback's owner restores it.
    loop_signals.rewind_requested.connect(rewind, sender=Run, dispatch_uid="reviews.rewind")
    # A proposed done is graded as the instance is configured to be, after the composition's role check.
    grading.register("configured", graders.on_done_proposed, order=grading.CONFIGURED)


def snapshot_start(sender: Any, run: Any, **kwargs: Any) -> None:
    # The workspace as the run found it: the review's diff starts here (once no rollback is writing it).
    rollback.wait_for_rollback(run)
    snapshots.take(run)


def mark_iteration(sender: Any, run: Any, number: int, **kwargs: Any) -> None:
    # The workspace as the iteration's first attempt found it, once no rollback is writing it.
    rollback.wait_for_rollback(run)
    snapshots.mark_iteration(run, number)


def lost_changes(sender: Any, run: Any, iteration: int, **kwargs: Any) -> Any:
    return snapshots.changed_since_iteration(run, iteration)


def rewind(sender: Any, run: Any, token: str, to: int, iteration: int, **kwargs: Any) -> dict[str, Any]:
    # The run itself, under its own lease, back to the state its iteration `to` left the workspace in.
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


def run_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    # Receipt, review queue and notifications (never raises).
    services.on_run_finished(run_id)


def forget_snapshots(sender: Any, instance: Any, **kwargs: Any) -> None:
    # A deleted run's workspace snapshots go with it (once the deletion commits).
    path = snapshots.git_dir(instance.pk)
    transaction.on_commit(lambda: shutil.rmtree(path, ignore_errors=True))
