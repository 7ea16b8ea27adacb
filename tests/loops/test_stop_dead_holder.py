"""A stop never waits for a dead driver's lease: it finishes the run and closes its reservation."""

import os
import socket
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest

from budgets.models import Reservation
from loops import leases, lifecycle, liveness, runner, services
from loops.models import Event, Run

pytestmark = pytest.mark.django_db(transaction=True)


def dead_pid() -> int:
    """The pid of a process of this machine that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def begun(run, holder):
    """Claim `run` for `holder` and open its first iteration (its reservation is held)."""
    lease = leases.claim(run.pk, 1, holder)
    assert lease is not None
    assert runner._begin(lease) is not None
    return lease


def test_stop_finishes_at_once_when_the_holder_on_this_machine_is_dead(user, make_instance, script, start):
    run = start(make_instance(user, command=script("time.sleep(60)\n")))
    holder = f"{socket.gethostname()}:{dead_pid()}"
    lease = begun(run, holder)
    assert Reservation.objects.filter(run_id=run.pk, status="held").exists()

    run = services.run_cancel(run=run, user=user)

    assert (run.status, run.outcome) == ("finished", "cancelled")
    assert "whose worker had died" in run.outcome_detail
    assert run.lease_token is None and run.lease_holder == ""
    assert not Reservation.objects.filter(run_id=run.pk, status="held").exists()
    assert Reservation.objects.filter(run_id=run.pk, iteration=1, status="abandoned").exists()
    assert Event.objects.filter(run=run, kind="run.finished", data__outcome="cancelled").count() == 1
    with pytest.raises(leases.LeaseLost):  # were the driver to come back, its writes are fenced off
        runner.iterate(lease)


def test_stop_leaves_a_live_holder_to_stop_its_own_act(user, make_instance, script, start):
    run = start(make_instance(user, command=script("time.sleep(60)\n")))
    holder = f"{socket.gethostname()}:{os.getpid()}"  # this test process: alive
    liveness.beat(holder)
    begun(run, holder)

    run = services.run_cancel(run=run, user=user)

    assert run.status == "running" and run.cancel_requested_at is not None
    assert run.lease_holder == holder
    assert Reservation.objects.filter(run_id=run.pk, status="held").exists()


def test_a_holder_on_another_machine_is_gone_once_its_beat_falls_silent(
    user, make_instance, script, start, settings
):
    settings.TETHER_HOLDER_SILENT_SECONDS = 5
    settings.TETHER_BEATS_SHARED = True  # as with Redis: every machine's beats are in one cache
    beating = start(make_instance(user, name="beating", command=script("time.sleep(60)\n")))
    silent = start(make_instance(user, name="silent", command=script("time.sleep(60)\n")))
    alive_holder = f"elsewhere-{uuid.uuid4().hex}:4242"
    dead_holder = f"elsewhere-{uuid.uuid4().hex}:4242"  # never beat here (or its beat expired)
    liveness.beat(alive_holder)
    begun(beating, alive_holder)
    begun(silent, dead_holder)

    assert services.run_cancel(run=beating, user=user).status == "running"
    silent = services.run_cancel(run=silent, user=user)
    assert (silent.status, silent.outcome) == ("finished", "cancelled")


def test_a_holder_named_otherwise_or_out_of_sight_is_never_judged_dead(settings):
    assert not liveness.holder_gone("test-driver")
    assert not liveness.holder_gone("")
    settings.TETHER_BEATS_SHARED = False  # another machine's beats are not in this cache
    assert not liveness.holder_gone(f"elsewhere-{uuid.uuid4().hex}:4242")


@pytest.mark.slow
def test_stop_right_after_a_worker_sigkill_is_prompt(user, make_instance, script, start, tmp_path):
    """The issue's case: a worker dies mid-act, a person presses Stop at once; another cluster lives on."""
    from tests.support.cluster import Cluster, wait_for

    run = start(make_instance(user, command=script("time.sleep(60)\n"), act_timeout_seconds=120))
    first = Cluster("first", tmp_path, TETHER_LEASE_SECONDS="10")
    second = None
    try:
        wait_for(lambda: Event.objects.filter(run=run, kind="act.started").exists(), 30, "the act to start")
        first.kill()
        second = Cluster("second", tmp_path, TETHER_LEASE_SECONDS="10")
        services.run_cancel(run=run, user=user)
        finished = wait_for(
            lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 10, "the stopped run to finish"
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert finished.outcome == "cancelled"
    assert finished.finished_at - finished.cancel_requested_at <= timedelta(seconds=2)
    assert not Reservation.objects.filter(run_id=run.pk, status="held").exists()
    assert Reservation.objects.filter(run_id=run.pk, iteration=1, status="abandoned").exists()


def test_a_holder_that_dies_just_after_the_stop_is_swept_by_any_live_worker(
    user, make_instance, script, start
):
    from loops import driver

    run = start(make_instance(user, command=script("time.sleep(60)\n")))
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = f"{socket.gethostname()}:{worker.pid}"
    try:
        liveness.beat(holder, [run.pk])  # a live driver beats
        begun(run, holder)
        assert services.run_cancel(run=run, user=user).status == "running"  # alive: it stops its own act
        assert driver.sweep_stops() == 0
    finally:
        worker.kill()
        worker.wait()
    assert driver.sweep_stops() == 1  # now dead: finished without waiting for the lease
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("finished", "cancelled")
    assert run.outcome_detail == "stopped by ada in iteration 1, whose worker had died"
    assert Reservation.objects.filter(run_id=run.pk, iteration=1, status="abandoned").exists()
    assert Event.objects.filter(run=run, kind="run.finished").count() == 1
    assert driver.sweep_stops() == 0


def test_an_iteration_cannot_begin_on_a_run_finished_while_it_read(user, make_instance, script, start):
    """A driver judged dead (it was not) must not open an iteration on the run the stop just finished.

    The stop holds the run's row while it finishes it; a begin that read the row before the
    stop committed used to go on to reserve, leaving a reservation held on a finished run.
    """
    import threading

    from django.db import connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises the two writers whole: the begin's write fails and re-reads")
    run = start(make_instance(user, command=script("print('hi')\n")))
    lease = leases.claim(run.pk, 1, "vm:1")
    locked, finished = threading.Event(), threading.Event()

    def stop_it():
        try:
            with transaction.atomic():
                held = Run.objects.select_for_update().get(pk=run.pk)
                locked.set()
                lifecycle.finish_unheld(held, "stopped by a person (test)")
                finished.wait(1.0)  # the begin is reading meanwhile
        finally:
            connection.close()

    stopper = threading.Thread(target=stop_it)
    stopper.start()
    assert locked.wait(10)
    try:
        threading.Timer(0.5, finished.set).start()
        with pytest.raises(leases.LeaseLost):
            runner._begin(lease)
    finally:
        stopper.join(10)
    assert not Reservation.objects.filter(run_id=run.pk, status="held").exists()
    assert not Event.objects.filter(run=run, kind="iteration.started").exists()
