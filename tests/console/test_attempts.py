"""An iteration started again after its worker died reads "attempt 2 of iteration N", not a second start."""

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from loops.models import Event, Run
from web.console.display import EventView


def view(kind, data):
    return EventView(run_id=1, seq=1, kind=kind, at=timezone.now(), data=data, iteration=data.get("iteration"))


@pytest.mark.parametrize(
    ("kind", "data", "label"),
    [
        ("iteration.started", {"iteration": 3, "attempt": 2}, "attempt 2 of iteration 3"),
        ("iteration.started", {"iteration": 1, "attempt": 3}, "attempt 3 of iteration 1"),
        ("iteration.started", {"iteration": 3, "attempt": 1}, ""),  # the first start is just the iteration
        ("iteration.started", {"iteration": 3}, ""),  # recorded before attempts were
        ("iteration.started", {"iteration": 3, "attempt": "2"}, ""),
        ("iteration.started", {"iteration": 3, "attempt": True}, ""),
        ("iteration.started", {"attempt": 2}, ""),
        ("run.claimed", {"iteration": 3, "attempt": 2}, ""),  # a claim is not a start
    ],
)
def test_attempt_label(kind, data, label):
    assert view(kind, data).attempt_label == label


def _titles(html):
    return [" ".join(re.sub(r"<[^>]+>", " ", t).split()) for t in re.findall(r'<span class="ev-title">(.*?)</span>\s*<span class="ev-meta">', html, re.S)]


@pytest.mark.django_db(transaction=True)
def test_an_iteration_started_again_after_its_worker_died_says_attempt_2(
    signed_in, user, make_instance, script, start_run
):
    from loops import driver
    from tests.loops.conftest import Background, drive_in_thread

    # The first act hangs (its worker will die under it); the second finishes at once.
    agent = script(
        """
        marker = pathlib.Path('started-once')
        if not marker.exists():
            marker.write_text('x'); time.sleep(60)
        print('done')
        """
    )
    inst = make_instance(user, command=agent)
    run = start_run(inst)
    first = Background(run).start()
    # The agent's own marker, not `act.started` (recorded before its program is spawned): the
    # worker must die under a running act, or the second attempt is the one that hangs.
    marker = Path(inst.workspace) / "started-once"
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the first act did not start"
        time.sleep(0.05)
    first.lease.stop.set()  # the worker goes away mid-act: the act ends, nothing is recorded
    first.join(20)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert driver.reap() == 1

    run = drive_in_thread(run)
    assert (run.outcome, run.iterations_done) == ("done", 1)
    starts = Event.objects.filter(run=run, kind="iteration.started").order_by("seq")
    assert [(e.data["iteration"], e.data["attempt"]) for e in starts] == [(1, 1), (1, 2)]

    titles = _titles(signed_in.get(f"/runs/{run.pk}/").content.decode())
    assert "Iteration 1" in titles
    assert "Attempt 2 of iteration 1 (its last worker was lost)" in titles
    assert titles.count("Iteration 1") == 1
