"""A worker cluster stopped cleanly (SIGTERM to its master, as `serve` does on Ctrl-C) hands its leases back."""

import time

import pytest

from loops.models import Event
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_cleanly_stopped_cluster_hands_its_running_run_back_at_once(user, make_instance, script, clusters, start, tmp_path):
    workspace = tmp_path / "ws-handover"
    workspace.mkdir()
    # Each act marks that it began, then takes long; the run never finishes by itself.
    agent = script(
        """
        p = pathlib.Path('acts'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
        time.sleep(60)
        """
    )
    # Leases far longer than the test's bound: only a handed-back lease lets the second cluster in.
    slow_lease = {"TETHER_LEASE_SECONDS": "60", "TETHER_DB_RETRY_SECONDS": "60"}
    inst = make_instance(user, command=agent, workspace=str(workspace), act_timeout_seconds=120)
    first = clusters("first", **slow_lease)
    run = start(inst)
    wait_for(lambda: (workspace / "acts").exists(), 30, "the first act to start")
    claimed = Event.objects.get(run=run, kind="run.claimed")
    worker = claimed.data["worker"]

    first.stop()  # SIGTERM to the master, as `serve` sends on Ctrl-C
    assert first.proc.returncode is not None

    # The stopping worker handed the lease back: no holder, an event says who and why, and the
    # act it cut short is a lost attempt, as the reaper would have recorded it 60 s later.
    run.refresh_from_db()
    assert (run.status, run.lease_token, run.lease_holder) == ("running", None, ""), first.tail()
    [released] = Event.objects.filter(run=run, kind="run.released")
    assert released.data == {"iteration": 1, "previous_worker": worker, "reason": "its worker stopped"}
    [lost] = Event.objects.filter(run=run, kind="attempt.lost")
    assert (lost.data["iteration"], lost.data["attempt"], lost.data["worker"]) == (1, 1, worker)
    assert not Event.objects.filter(run=run, kind="run.reaped").exists()

    stopped_at = time.monotonic()
    second = clusters("second", **slow_lease)
    wait_for(
        lambda: Event.objects.filter(run=run, kind="act.started").count() >= 2,
        30,  # a bound, not the measure: the handover is the events above and the claim below
        "the second cluster to start the run's next act",
    )
    took = time.monotonic() - stopped_at
    again = Event.objects.filter(run=run, kind="run.claimed").order_by("seq").last()
    assert again.seq > released.seq and again.data["worker"] != worker, second.tail()
    # (The wait's bound, 30 s, is half the old lease: only the handed-back lease let it in.)
    print(f"next act started {took:.2f}s after the stop (cluster start included)")
