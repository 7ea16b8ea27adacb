"""A record begins the next iteration in its own transaction only when nothing stands in its way.

What `_begin` checks before an iteration — a stop, the deadline, a person's message, the
instance as it is now — must hold just the same when the record of the one before begins it.
Each act here does, mid-act, what a person would do from the console, and the next iteration
must see it. The loop is driven in this thread with an act that returns at once.
"""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from loops.models import Event, Run

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[tuple[int, float, str]] = []  # (iteration, its timeout, its instruction), act by act
DURING: dict[int, object] = {}  # iteration -> what its act does (given the run's id)


class WatchingBrain:
    def __init__(self, instance):
        self.instance = instance

    def act(self, request):
        from instances.brains.base import Reply, Usage

        SEEN.append((request.iteration, request.timeout, request.instruction))
        request.workspace.mkdir(parents=True, exist_ok=True)
        (request.workspace / "n").write_text(str(request.iteration))  # progress: the loop goes on
        if (during := DURING.get(request.iteration)) is not None:
            during(request.run_id)
        return Reply(ok=False, text="ok", usage=Usage(cost_micros=10), detail=f"step {request.iteration}")


@pytest.fixture
def driven(user, settings):
    from instances.models import Instance
    from loops import leases, runner, services

    settings.TETHER_BRAINS = {"watching": f"{__name__}.WatchingBrain"}
    SEEN.clear()
    DURING.clear()

    def drive(iterations=4, **fields):
        instance = Instance.objects.create(
            owner=user, name="watched", brain="watching", workspace=str(Path(settings.TETHER_WORKSPACES) / "w"),
            max_iterations=iterations, act_timeout_seconds=30,
        )
        run = services.run_start(instance=instance, user=user, objective="watch", **fields)
        runner.drive(leases.claim(run.pk, 1, "test"), slice_seconds=3600)
        return Run.objects.get(pk=run.pk)

    return drive


def fused(run):
    """How many iterations began in their predecessor's record (their start shares its timestamp)."""
    started = dict(
        Event.objects.filter(run=run, kind="iteration.started").values_list("data__iteration", "created_at")
    )
    finished = dict(
        Event.objects.filter(run=run, kind="iteration.finished").values_list("data__iteration", "created_at")
    )
    return sum(1 for n, at in started.items() if finished.get(n - 1) == at)


def test_a_steady_run_begins_each_iteration_in_the_record_of_the_one_before(driven):
    run = driven(iterations=5)
    assert (run.outcome, run.iterations_done) == ("max_iterations", 5)
    assert fused(run) == 4
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # the sequence stays gap-free


def test_an_instance_edited_mid_act_is_what_the_next_iteration_runs_with(driven):
    from instances.models import Instance

    def edit(run_id):
        instance = Instance.objects.get(runs__pk=run_id)
        instance.act_timeout_seconds = 77
        instance.save()

    DURING[2] = edit
    driven(iterations=4)
    assert [(n, timeout) for n, timeout, _ in SEEN] == [(1, 30), (2, 30), (3, 77), (4, 77)]


def test_a_message_sent_mid_act_reaches_the_next_iteration(driven):
    from loops import services

    DURING[2] = lambda run_id: services.run_interject(
        run=Run.objects.get(pk=run_id), user=Run.objects.get(pk=run_id).owner, text="use the other branch"
    )
    run = driven(iterations=3)
    assert ["use the other branch" in instruction for _, _, instruction in SEEN] == [False, False, True]
    assert Event.objects.get(run=run, kind="iteration.started", data__iteration=3).data["interjections"] == 1


def test_a_stop_asked_mid_act_ends_the_run_before_the_next_iteration(driven):
    # what `run_cancel` writes while a live driver holds the run
    DURING[2] = lambda run_id: Run.objects.filter(pk=run_id).update(cancel_requested_at=timezone.now())
    run = driven(iterations=5)
    assert (run.outcome, run.iterations_done, run.outcome_detail) == (
        "cancelled", 2, "stopped by a person before iteration 3"
    )
    assert not Event.objects.filter(run=run, kind="iteration.started", data__iteration=3).exists()


def test_a_deadline_passed_mid_act_ends_the_run_before_the_next_iteration(driven):
    DURING[2] = lambda run_id: Run.objects.filter(pk=run_id).update(deadline=timezone.now() - timedelta(seconds=1))
    run = driven(iterations=5)
    assert (run.outcome, run.iterations_done) == ("timed_out", 2)
