"""A lost attempt leaves a trace: `attempt.lost` names its worker, what was closed for it and what it changed."""

import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from budgets import money
from budgets.models import Reservation
from loops import driver, leases, runner
from loops.models import Event, Run
from tests.support.cluster import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# The first attempt changes the workspace, then hangs until its worker dies; a re-run sees the
# file it left and answers with the instruction it was given.
AGENT = """
instruction = sys.stdin.read()
notes = pathlib.Path('notes.txt')
if not notes.exists():
    notes.write_text('half done')
    pathlib.Path('keep.txt').write_text('changed')
    pathlib.Path('old.txt').unlink()
    time.sleep(30)
print(instruction)
"""

INTERRUPTED = "A previous attempt of this iteration was interrupted"
CHANGED = [
    {"path": "keep.txt", "change": "modified"},
    {"path": "notes.txt", "change": "added"},
    {"path": "old.txt", "change": "deleted"},
]


@pytest.fixture
def agent(user, make_instance, script, tmp_path):
    workspace = tmp_path / "lost-ws"
    workspace.mkdir()
    (workspace / "keep.txt").write_text("as found")
    (workspace / "old.txt").write_text("to be deleted")
    return make_instance(user, command=script(AGENT), workspace=str(workspace), act_timeout_seconds=60)


def expire(run):
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


class Doomed:
    """A driver whose act hangs in a thread: it is lost when its lease is taken from it."""

    def __init__(self, run, holder="doomed-worker"):
        self.lease = leases.claim(run.pk, run.next_iteration, holder)
        assert self.lease is not None
        self.thread = threading.Thread(target=runner.drive, args=(self.lease,), daemon=True)
        self.thread.start()
        workspace = Path(run.instance.workspace_path())
        wait_for(lambda: (workspace / "notes.txt").exists(), 30, "the act to change the workspace")

    def let_go(self):
        self.lease.stop.set()  # its act ends; the driver finds its lease lost and writes nothing
        self.thread.join(30)
        assert not self.thread.is_alive()


def lost_events(run):
    return list(Event.objects.filter(run=run, kind="attempt.lost").order_by("seq"))


def abandoned(run, iteration=1):
    return Reservation.objects.get(run_id=run.pk, iteration=iteration, status="abandoned")


def test_the_reaper_records_the_lost_attempt_and_the_rerun_is_told(agent, start, drive):
    run = start(agent)
    doomed = Doomed(run)
    expire(run)
    assert driver.reap() == 1
    doomed.let_go()
    [lost] = lost_events(run)
    reservation = abandoned(run)
    assert lost.data["iteration"] == 1 and lost.data["attempt"] == 1
    assert lost.data["worker"] == "doomed-worker"
    assert lost.data["changed"] == CHANGED and "changes_unknown" not in lost.data
    assert lost.data["reservations"] == [reservation.pk]
    assert lost.data["closed_usd"] == money.usd_string(reservation.actual) == money.usd_string(reservation.amount)
    assert reservation.actual > 0
    run = drive(run)
    assert run.outcome == "done"
    started = Event.objects.get(run=run, kind="iteration.started", data__attempt=2).data["instruction"]
    answered = run.iterations.get(number=1).response
    for text in (started, answered):  # what the timeline shows is what the re-run's agent was given
        assert f"{INTERRUPTED}; it changed keep.txt, notes.txt (added), old.txt (deleted)" in text
    assert len(lost_events(run)) == 1
    assert run.spent_micros == reservation.actual  # the re-run reported no spend


def test_a_claim_that_takes_an_expired_lease_records_the_lost_attempt_once(agent, start, drive):
    run = start(agent)
    doomed = Doomed(run)
    expire(run)
    lease = leases.claim(run.pk, 1, "second-worker")  # no reaper in between
    assert lease is not None
    doomed.let_go()
    [lost] = lost_events(run)
    assert (lost.data["worker"], lost.data["changed"]) == ("doomed-worker", CHANGED)
    assert lost.data["closed_usd"] == money.usd_string(abandoned(run).actual)
    assert driver.reap() == 0
    runner.drive(lease)
    run.refresh_from_db()
    assert run.outcome == "done" and INTERRUPTED in run.iterations.get(number=1).response
    assert len(lost_events(run)) == 1


def test_a_stop_after_the_worker_died_records_the_lost_attempt(agent, start, user):
    from loops import services

    run = start(agent)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    holder = f"{socket.gethostname()}:{child.pid}"  # a driver of this machine whose process has exited
    doomed = Doomed(run, holder)
    run = services.run_cancel(run=run, user=user)
    doomed.let_go()
    assert run.outcome == "cancelled"
    [lost] = lost_events(run)
    assert (lost.data["worker"], lost.data["changed"]) == (holder, CHANGED)
    assert lost.data["closed_usd"] == money.usd_string(abandoned(run).actual)


def test_a_workspace_without_snapshots_says_its_changes_are_unknown(agent, start, drive, settings):
    settings.TETHER_SNAPSHOT_MAX_FILES = 1  # the workspace is too big for snapshots
    run = start(agent)
    doomed = Doomed(run)
    expire(run)
    assert driver.reap() == 1
    doomed.let_go()
    [lost] = lost_events(run)
    assert "changed" not in lost.data
    assert "more than 1 files" in lost.data["changes_unknown"]
    run = drive(run)
    told = run.iterations.get(number=1).response
    assert f"{INTERRUPTED}; what it changed is unknown (" in told


def test_a_claim_without_a_begun_attempt_records_nothing(user, make_instance, start):
    run = start(make_instance(user))
    assert leases.claim(run.pk, 1, "died-before-acting") is not None
    expire(run)
    assert driver.reap() == 1
    assert lost_events(run) == []


def test_the_run_page_the_receipt_and_the_review_show_the_lost_attempt(agent, start, drive, client, user):
    from reviews.models import ReviewItem

    run = start(agent)
    doomed = Doomed(run)
    expire(run)
    assert driver.reap() == 1
    doomed.let_go()
    run = drive(run)
    closed = money.format_usd(abandoned(run).actual)
    headline = f"Attempt 1 of iteration 1 was lost: worker doomed-worker died; {closed} closed; it changed keep.txt"
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert headline in page
    receipt = client.get(f"/runs/{run.pk}/receipt").content.decode()
    assert headline in receipt
    downloaded = client.get(f"/runs/{run.pk}/receipt.json").json()["receipt"]["lost_attempts"]
    assert downloaded == [
        {
            "iteration": 1,
            "attempt": 1,
            "worker": "doomed-worker",
            "lost_at": downloaded[0]["lost_at"],
            "closed_usd": money.usd_string(abandoned(run).actual),
            "changed": CHANGED,
            "more": 0,
            "changes_unknown": None,
            "tool_calls": [],
        }
    ]
    item, _ = ReviewItem.objects.get_or_create(run=run, defaults={"reason": "test"})
    user.is_staff = True
    user.save()
    review = client.get(f"/reviews/{item.pk}/").content.decode()
    assert headline in review


def test_the_event_reads_as_a_sentence():
    from loops import event_kinds

    title = event_kinds.describe(
        "attempt.lost",
        {"iteration": 3, "attempt": 1, "worker": "w1", "closed_usd": "0.012300", "changed": CHANGED[:2], "more": 3},
    )
    assert title.text == (
        "Attempt 1 of iteration 3 was lost: worker w1 died; $0.0123 closed; "
        "it changed keep.txt, notes.txt (added) and 3 more files"
    )
    unknown = event_kinds.describe("attempt.lost", {"iteration": 2, "changes_unknown": "git is not installed"})
    assert unknown.text.endswith("what it changed is unknown (git is not installed)")
    assert event_kinds.in_iteration("attempt.lost", {"iteration": 2}) == 2
