"""Exactly once per firing: two worker processes tick the same schedules on PostgreSQL; one is SIGKILLed while
it fires (its run's row half-written, inside the firing's transaction). Every firing still has one run."""

import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from loops.models import Run
from tests.support.cluster import wait_for, worker_env
from triggers import scheduling
from triggers.models import Firing

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="two clusters share one PostgreSQL database"
    ),
]

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
MINUTES = 5
# A worker: the tick at 10 s past each minute, as django-q2's scheduler would call it, with the clock passed in.
WORKER = textwrap.dedent(
    """
    import sys
    from datetime import datetime, timedelta
    import django
    django.setup()
    from triggers import scheduling
    start = datetime.fromisoformat(sys.argv[1])
    for minute in range(1, int(sys.argv[2]) + 1):
        scheduling.tick(start + timedelta(minutes=minute, seconds=10))
    """
)


def _worker() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, T0.isoformat(), str(MINUTES)],
        cwd=settings.BASE_DIR,
        env=worker_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _waiting_locks(cursor) -> int:
    cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
    return cursor.fetchone()[0]


def test_two_clusters_one_killed_while_firing_every_firing_one_run(user, instance):
    schedules = [
        scheduling.schedule_create(
            user=user,
            instance=instance,
            name=f"s{i}",
            objective_template="tick {time}",
            cron="* * * * *",
            overlap="allow_all",
            now=T0,
        )
        for i in range(3)
    ]
    db = connection.settings_dict
    blocker = psycopg.connect(
        host=db.get("HOST") or "127.0.0.1",
        port=db.get("PORT") or 5432,
        user=db.get("USER") or "postgres",
        dbname=db["NAME"],
        autocommit=False,
    )
    a = b = None
    try:
        with blocker.cursor() as cursor:
            # Runs cannot be written while this holds: the first worker stops inside its first firing's
            # transaction (the schedule's row locked, the firing row made, the run's INSERT waiting).
            cursor.execute("LOCK TABLE loops_run IN EXCLUSIVE MODE")
            a = _worker()
            wait_for(lambda: _waiting_locks(cursor) >= 1, 60, "worker A to block inside a firing")
            b = _worker()
            wait_for(lambda: _waiting_locks(cursor) >= 2, 60, "worker B to wait for A's schedule row")
            os.killpg(a.pid, signal.SIGKILL)  # the whole worker, mid-firing
            a.wait(timeout=30)
        blocker.commit()  # A's backend finds its client gone and rolls the firing back; B goes on
        out, _ = b.communicate(timeout=300)
        assert b.returncode == 0, out.decode(errors="replace")[-3000:]
    finally:
        blocker.close()
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    expected = {(s.pk, T0 + timedelta(minutes=m)) for s in schedules for m in range(1, MINUTES + 1)}
    firings = list(Firing.objects.all())
    assert {(f.schedule_id, f.scheduled_for) for f in firings} == expected
    assert len(firings) == len(expected)  # unique per (schedule, time): no firing twice
    assert all(f.outcome == "started" and f.run_id for f in firings), [(f.outcome, f.reason) for f in firings]
    runs = list(Run.objects.filter(origin="schedule"))
    assert len(runs) == len(expected) and Run.objects.count() == len(expected)  # no run without its firing
    assert sorted(r.origin_ref["firing"] for r in runs) == sorted(f.pk for f in firings)
    assert sorted(r.pk for r in runs) == sorted(f.run_id for f in firings)
