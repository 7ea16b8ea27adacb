"""Pickup at fleet speed: a driver claims the runs waiting for one in batches, not one queue task each."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from loops import leases, runner
from loops.models import Event, Run
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def started(user, make_instance, start, count):
    return [start(make_instance(user, name=f"i{i}")) for i in range(count)]


def test_a_batch_claims_waiting_runs_as_a_claim_does(user, make_instance, start):
    runs = started(user, make_instance, start, 5)
    first = leases.claim_due("w1", 3)
    assert [lease.run_id for lease, _ in first] == [r.pk for r in runs[:3]]  # longest waiting first
    for lease, iteration in first:
        run = Run.objects.get(pk=lease.run_id)
        assert (iteration, run.status, run.attempt) == (1, "running", 1)
        assert (run.lease_token, run.lease_holder) == (lease.token, "w1")
        assert run.lease_expires_at > timezone.now() and run.started_at is not None
        claimed = Event.objects.get(run=run, kind="run.claimed")
        assert claimed.seq == lease.claimed_seq
        assert claimed.data == {"iteration": 1, "worker": "w1", "attempt": 1}
    assert len({lease.token for lease, _ in first}) == 3
    rest = leases.claim_due("w2", 10)
    assert [lease.run_id for lease, _ in rest] == [r.pk for r in runs[3:]]
    assert leases.claim_due("w3", 10) == []
    assert leases.claim(runs[0].pk, 1, "w3") is None  # a queue task that comes later takes nothing
    lease, _ = first[0]
    runner.drive(lease)  # a batch's lease drives like any other
    assert Run.objects.get(pk=lease.run_id).outcome == "done"


def test_a_batch_leaves_expired_leases_to_the_reaper_and_ends_spent_runs_crashed(user, make_instance, start, settings):
    settings.TETHER_MAX_ATTEMPTS = 3
    held, spent = started(user, make_instance, start, 2)
    assert leases.claim(held.pk, 1, "dead") is not None
    Run.objects.filter(pk=held.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    Run.objects.filter(pk=spent.pk).update(attempt=3)  # reaped after its third attempt died
    assert leases.claim_due("w", 10) == []
    held.refresh_from_db()
    spent.refresh_from_db()
    assert held.lease_holder == "dead"  # the reaper's: it closes what the dead attempt reserved first
    assert (spent.status, spent.outcome) == ("finished", "crashed")


def test_two_drivers_claiming_at_once_never_hold_one_run_both(user, make_instance, start):
    runs = started(user, make_instance, start, 30)
    barrier = threading.Barrier(2)
    found: dict[str, list] = {}

    def pickup(holder):
        try:
            barrier.wait(timeout=10)
            found[holder] = leases.claim_due(holder, 30)
        finally:
            connection.close()

    threads = [threading.Thread(target=pickup, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    a = {lease.run_id: lease.token for lease, _ in found["a"]}
    b = {lease.run_id: lease.token for lease, _ in found["b"]}
    assert not set(a) & set(b)
    assert set(a) | set(b) == {r.pk for r in runs}
    held = dict(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", "lease_token"))
    assert held == {**a, **b}
    assert Event.objects.filter(run__in=runs, kind="run.claimed").count() == len(runs)


@pytest.mark.slow
def test_runs_whose_queue_tasks_never_come_are_picked_up_by_a_driver(user, make_instance, script, start, tmp_path):
    """The queue stalls (its tasks for these runs are gone); a worker's driver claims them all anyway.

    Their pickup deadline (TETHER_LEASE_SECONDS, 30 s here) is far off, so the reaper would not
    re-schedule them within the wait: only the driver's own pickup can take them.
    """
    from django_q.models import OrmQ

    runs = [start(make_instance(user, name=f"i{i}", command=script("print('done')\n"))) for i in range(12)]
    assert OrmQ.objects.count() == len(runs)
    OrmQ.objects.all().delete()
    cluster = Cluster("pickup", tmp_path, TETHER_LEASE_SECONDS="30", TETHER_WORKERS="2")
    try:
        wait_for(
            lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="finished").count() == len(runs),
            20,
            "every run to be picked up and finish",
        )
    finally:
        cluster.stop()
    assert not Event.objects.filter(run__in=runs, kind="run.reaped").exists()
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("outcome", flat=True)) == {"done"}
    assert Event.objects.filter(run__in=runs, kind="run.claimed").count() == len(runs)
