"""A transient database fault inside a driver is retried in place: no attempt is lost.

The fault is injected where the database meets Tether: Django's documented query hook
(`connection.execute_wrapper`) fires before one chosen statement. On PostgreSQL it
terminates this very connection's backend (`pg_terminate_backend`), so the statement
meets a real cut; on SQLite it raises the "database is locked" a busy writer causes.
"""

import pytest
from django.db import InterfaceError, OperationalError, connection

from budgets.models import Reservation
from loops.models import Event, Iteration, Run
from tests.support.pg import cut, terminate_backend
from tether import dbfaults

pytestmark = pytest.mark.django_db(transaction=True)


class FaultOnce:
    """Before the first statement containing `marker` (the `skip`+1-th one), break the connection."""

    def __init__(self, marker: str, skip: int = 0) -> None:
        self.marker = marker
        self.skip = skip
        self.fired = 0

    def __call__(self, execute, sql, params, many, context):
        if self.marker in sql and not self.fired:
            if self.skip:
                self.skip -= 1
            else:
                self.fired += 1
                if connection.vendor == "postgresql":
                    terminate_backend(context["connection"].connection.info.backend_pid)
                else:
                    raise OperationalError("database is locked")
        return execute(sql, params, many, context)


def counting_instance(make_instance, user, script):
    agent = script(
        "p = pathlib.Path('count'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))\n"
    )
    check = script("sys.exit(0 if int(pathlib.Path('count').read_text()) >= 2 else 1)\n")
    return make_instance(user, command=agent, checks=[{"name": "two", "command": check}])


@pytest.mark.parametrize(
    ("where", "marker", "skip"),
    [
        ("claim", 'UPDATE "loops_run" SET "lease_token"', 0),
        ("begin", 'INSERT INTO "budgets_reservation"', 1),  # iteration 2's reservation
        ("record", 'INSERT INTO "loops_iteration"', 0),  # iteration 1's record
    ],
)
def test_a_fault_in_a_drivers_transaction_is_retried_and_loses_no_attempt(
    where, marker, skip, user, make_instance, script, start, drive, caplog
):
    run = start(counting_instance(make_instance, user, script))
    fault = FaultOnce(marker, skip)
    with connection.execute_wrapper(fault):
        run = drive(run)
    assert fault.fired == 1, f"the fault at {where} never fired"
    assert (run.outcome, run.verified) == ("done", True)
    assert list(Iteration.objects.filter(run=run).order_by("number").values_list("number", flat=True)) == [
        1,
        2,
    ]
    assert Event.objects.filter(run=run, kind="run.claimed").count() == 1  # one attempt, never re-claimed
    assert not Event.objects.filter(run=run, kind="run.reaped").exists()
    for number in (1, 2):
        assert Event.objects.filter(run=run, kind="iteration.started", data__iteration=number).count() == 1
    assert list(
        Reservation.objects.filter(run_id=run.pk, call=0)
        .order_by("iteration")
        .values_list("iteration", "status")
    ) == [
        (1, "settled"),
        (2, "settled"),
    ]
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert "transient database error" in caplog.text


def test_a_record_whose_commit_landed_but_whose_answer_was_cut_begins_the_next_iteration_once(
    user, make_instance, script, start, drive, monkeypatch
):
    """Iteration 1's record (which begins iteration 2) commits, then the connection dies before it says so.

    The retry finds the record written and must take iteration 2 as begun: one start, one
    reservation, a gap-free sequence.
    """
    run = start(counting_instance(make_instance, user, script))
    recorded, cut = [], []

    def watch(execute, sql, params, many, context):
        if 'INSERT INTO "loops_iteration"' in sql:
            recorded.append(sql)
        return execute(sql, params, many, context)

    commit = connection._commit

    def commit_then_cut():
        commit()
        if recorded and not cut:
            cut.append(True)
            raise lost_answer()

    monkeypatch.setattr(connection, "_commit", commit_then_cut)
    with connection.execute_wrapper(watch):
        run = drive(run)
    assert cut, "the cut never fired"
    assert (run.outcome, run.verified) == ("done", True)
    assert Event.objects.filter(run=run, kind="iteration.started", data__iteration=2).count() == 1
    assert list(
        Reservation.objects.filter(run_id=run.pk, call=0).order_by("iteration").values_list("iteration", "status")
    ) == [(1, "settled"), (2, "settled")]
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def lost_answer():
    """The error a connection cut just after its commit raises (transient: the driver retries)."""
    if connection.vendor == "postgresql":
        import psycopg

        return wrapped(psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"))
    import sqlite3

    return wrapped(sqlite3.OperationalError("database is locked"))


def test_a_fault_that_does_not_pass_ends_the_attempt(user, make_instance, script, start, settings):
    """A driver gives up once TETHER_DB_RETRY_SECONDS pass; the error surfaces for the reaper."""
    from loops import leases, runner

    settings.TETHER_DB_RETRY_SECONDS = 0.3
    run = start(counting_instance(make_instance, user, script))

    def always(execute, sql, params, many, context):
        if 'INSERT INTO "loops_iteration"' in sql:
            raise OperationalError("database is locked")
        return execute(sql, params, many, context)

    lease = leases.claim(run.pk, 1, "doomed")
    with connection.execute_wrapper(always), pytest.raises(OperationalError):
        runner.drive(lease)
    assert not Iteration.objects.filter(run=run).exists()


def wrapped(cause):
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


def test_which_errors_are_transient():
    import sqlite3

    assert dbfaults.is_transient(wrapped(sqlite3.OperationalError("database is locked")))
    assert not dbfaults.is_transient(wrapped(sqlite3.OperationalError("no such table: loops_run")))
    assert dbfaults.is_transient(InterfaceError("connection already closed"))
    assert not dbfaults.is_transient(ValueError("database is locked"))  # not a database error at all


def test_postgresql_errors_are_judged_by_their_sqlstate():
    import psycopg.errors

    for cause, transient in [
        (psycopg.errors.SerializationFailure("could not serialize"), True),
        (psycopg.errors.DeadlockDetected("deadlock detected"), True),
        (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"), True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.UndefinedTable('relation "x" does not exist'), False),
    ]:
        assert dbfaults.is_transient(wrapped(cause)) is transient, cause
    lost = psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
    assert dbfaults.is_transient(wrapped(lost))  # the socket itself: no SQLSTATE


@pytest.mark.slow
def test_a_worker_whose_connections_are_cut_mid_run_loses_no_attempt(
    user, make_instance, script, start, tmp_path
):
    """pg_terminate_backend on every connection of a real worker cluster, mid-act and again and again."""


    from tests.support.cluster import Cluster, wait_for

    if connection.vendor != "postgresql":
        pytest.skip("cuts connections with pg_terminate_backend: runs on the PostgreSQL pass of the suite")
    agent = script(
        "time.sleep(1.0)\n"
        "p = pathlib.Path('count'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))\n"
    )
    check = script(
        "n = int(pathlib.Path('count').read_text()); print('count', n); sys.exit(0 if n >= 3 else 1)\n"
    )
    run = start(make_instance(user, command=agent, checks=[{"name": "three", "command": check}]))
    name = f"tether-cut-{run.pk}"
    cluster = Cluster("cut", tmp_path, PGAPPNAME=name, TETHER_LEASE_SECONDS="5")
    try:
        wait_for(
            lambda: Event.objects.filter(run=run, kind="act.started", data__iteration=2).exists(),
            60,
            "iteration 2's act to start",
        )
        terminated = cut(name, 1.5)  # through the end of the act and into the record
        assert terminated, "no connection of the worker was cut"
        finished = wait_for(
            lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 60, "the run to finish"
        )
        assert (finished.outcome, finished.verified) == ("done", True), cluster.tail()
        assert "transient database error" in cluster.tail(200_000)
    finally:
        cluster.stop()
    assert list(Iteration.objects.filter(run=run).order_by("number").values_list("number", flat=True)) == [
        1,
        2,
        3,
    ]
    assert Event.objects.filter(run=run, kind="run.claimed").count() == 1  # the attempt was never lost
    assert not Event.objects.filter(run=run, kind="run.reaped").exists()
    reservations = list(Reservation.objects.filter(run_id=run.pk, call=0).values_list("iteration", "status"))
    assert sorted(reservations) == [
        (1, "settled"),
        (2, "settled"),
        (3, "settled"),
    ]  # none extra, none abandoned
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_the_reaper_leaves_a_run_whose_live_driver_lost_renewals_to_a_cut(user, make_instance, script, start):
    """An expired lease whose holder still beats for the run is a cut connection, not a death."""
    import os
    import socket
    import subprocess
    import sys
    from datetime import timedelta

    from django.utils import timezone

    from loops import driver, leases, liveness

    def expire(run):
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    alive = f"{socket.gethostname()}:{os.getpid()}"  # this test process: alive, and beating below
    cut_off = start(make_instance(user, name="cut-off", command=script("pass\n")))
    forgotten = start(make_instance(user, name="forgotten", command=script("pass\n")))
    assert leases.claim(cut_off.pk, 1, alive) and leases.claim(forgotten.pk, 1, alive)
    liveness.beat(alive, [cut_off.pk])  # it drives cut_off; forgotten is no longer among its runs
    expire(cut_off)
    expire(forgotten)
    assert driver.reap() == 1
    assert not Event.objects.filter(run=cut_off, kind="run.reaped").exists()
    assert Event.objects.filter(run=forgotten, kind="run.reaped").exists()

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = f"{socket.gethostname()}:{child.pid}"
    killed = start(make_instance(user, name="killed", command=script("pass\n")))
    assert leases.claim(killed.pk, 1, dead)
    liveness.beat(dead, [killed.pk])  # its last beat still names the run, but its process is gone
    expire(killed)
    assert driver.reap() == 1
    assert Event.objects.filter(run=killed, kind="run.reaped").exists()


def test_a_lease_renewed_after_waiting_for_its_row_counts_from_when_it_is_written(
    user, make_instance, script, start, settings
):
    """A renewal that waited longer than the lease for its row must not write an expiry already past."""
    import threading
    import time
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from loops import leases

    settings.TETHER_LEASE_SECONDS = 1
    run = start(make_instance(user, command=script("pass\n")))
    lease = leases.claim(run.pk, 1, "elsewhere:1")
    locked = threading.Event()

    def hold_the_row():  # as a long iteration's transaction does
        try:
            with transaction.atomic():
                list(Run.objects.select_for_update().filter(pk=run.pk))
                locked.set()
                time.sleep(1.5)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    assert locked.wait(10)
    assert leases.renew([lease]) == {run.pk}
    holder.join()
    expires = Run.objects.get(pk=run.pk).lease_expires_at
    assert expires > timezone.now() + timedelta(seconds=0.5), "renewed to an expiry that had already passed"
