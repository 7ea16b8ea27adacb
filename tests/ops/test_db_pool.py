"""PostgreSQL connections are pooled per process: a run that gives its connection back before every
act takes one from the pool after it, never a new server process; a forked process opens its own."""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

ROOT = Path(__file__).resolve().parents[2]
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server process per connection")


def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_run_that_gives_its_connection_back_before_each_act_reuses_the_pools(user, settings):
    from instances.models import Instance
    from loops import runner, services

    settings.TETHER_BRAINS = {"instant": "bench.loop_bench.InstantBrain"}
    instance = Instance.objects.create(
        owner=user, name="gated", brain="instant", workspace=str(Path(settings.TETHER_WORKSPACES) / "gated"),
        max_iterations=8,
    )
    run = services.run_start(instance=instance, user=user, objective="reuse")
    lease = runner.claim(run.pk, 1, "test")
    lease.keeps_connection, lease.gate = False, threading.BoundedSemaphore(1)  # as a driver's gated run
    servers = []

    def opened(sender, connection, **kwargs):
        servers.append(connection.connection.info.backend_pid)

    connection_created.connect(opened)
    try:
        runner.drive(lease, slice_seconds=3600)
    finally:
        connection_created.disconnect(opened)
    run.refresh_from_db()
    assert (run.outcome, run.iterations_done) == ("max_iterations", 8)
    assert len(servers) >= 8  # the connection was given back before every act, and taken again after it
    assert len(set(servers)) <= 2, servers  # ... from the pool: without one, each is a new server process


def open_backends():
    """The server processes serving this database now (every session of this process's pool among them)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return {pid for (pid,) in cursor.fetchall()}


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_forked_process_opens_its_own_connections_and_leaves_its_parents_alone(db):
    backend_pid()
    connection.close()  # back to the pool, idle: what a forked child must not take
    before = open_backends()
    connection.close()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: one query, its server process's id to the parent, and out
        code = 1
        try:
            os.write(write, str(backend_pid()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    said = os.read(read, 64).decode()
    os.close(read)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and said
    # Without forgetting the inherited pool, the child took one of the parent's idle sessions.
    assert int(said) not in before, (said, before)
    assert backend_pid() in before  # ... and the parent's sessions still answer, from its own pool


def test_with_a_pool_a_server_that_does_not_answer_is_a_503_within_seconds(tmp_path):
    """The pool waits for a connection a short while, never its default half a minute."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = (
        "import json, time, django; django.setup()\n"
        "from django.test import Client\n"
        "began = time.monotonic(); response = Client().get('/readyz')\n"
        "print(json.dumps([response.status_code, time.monotonic() - began, response.json()['checks']['database']]))\n"
    )
    env = {
        **os.environ, "TETHER_HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "tether.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/tether", "TETHER_DB_POOL": "4",
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    status, seconds, said = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 503 and said.startswith("failed"), (status, said)
    assert seconds < 20, seconds  # psycopg_pool's own default would wait 30 s
