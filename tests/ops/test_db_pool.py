"""With TETHER_DB_POOL, a worker process pools its PostgreSQL connections: a run that gives its
connection back before every act takes one from the pool after it, never a new server process. The
web process does not pool: a server that does not answer is a 503 at once, not after a pool's wait."""

import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created

from loops.models import Run
from tests.support.cluster import Cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server process per connection")


@pytest.fixture
def pooled(settings):
    """This process's connections pooled, as a worker process's are (`tether.dbpool.enable`); undone after."""
    from tether import dbpool

    settings.TETHER_DB_POOL = 40

    configured = connections.settings["default"]
    saved = (configured["CONN_MAX_AGE"], dict(configured.get("OPTIONS", {})))
    connections.close_all()
    assert dbpool.enable()
    yield
    connections.close_all()
    connection.close_pool()
    configured["CONN_MAX_AGE"], configured["OPTIONS"] = saved


def claimed_run(user, settings, brain, *, iterations, gated):
    """Start a run of an in-process `brain` and claim it here; `gated`: it gives its connection back
    before every act, as a driver's runs beyond the ones that keep theirs do."""
    from instances.models import Instance
    from loops import leases, services

    settings.TETHER_BRAINS = {"test": brain}
    instance = Instance.objects.create(
        owner=user, name="gated", brain="test", workspace=str(Path(settings.TETHER_WORKSPACES) / "gated"),
        max_iterations=iterations,
    )
    run = services.run_start(instance=instance, user=user, objective="reuse")
    lease = leases.claim(run.pk, 1, "test")
    if gated:
        lease.keeps_connection, lease.gate = False, threading.BoundedSemaphore(1)
    return run, lease


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_run_that_gives_its_connection_back_before_each_act_reuses_the_pools(user, settings, pooled):
    from loops import runner

    run, lease = claimed_run(user, settings, "bench.loop_bench.InstantBrain", iterations=8, gated=True)
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


def sessions_opened():
    """How many sessions the server has opened on this database so far (PostgreSQL's own count)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


@postgresql_only
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_opens_no_server_process_per_iteration(user, make_instance, script, start, tmp_path):
    """Every run gives its connection back before its acts (no kept connections): the sessions the
    cluster opens do not grow with the iterations its runs go through."""
    iterations = 24
    act = script("pathlib.Path('n').write_text(os.environ['TETHER_ITERATION'])\n")
    instance = make_instance(
        user, name="gated", command=act, max_iterations=iterations,
        checks=[{"name": "never", "command": script("print('at', pathlib.Path('n').read_text()); sys.exit(1)\n"), "required": True}],
    )
    before = sessions_opened()
    cluster = Cluster("pool", tmp_path, TETHER_CONNECTIONS_PER_WORKER="0", TETHER_DB_POOL="40",
                      PGAPPNAME=f"tether-pool-{uuid.uuid4().hex[:8]}")
    try:
        run = start(instance)
        wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").exists(), 120, "the run to finish")
    finally:
        cluster.stop()
    run.refresh_from_db()
    assert (run.outcome, run.iterations_done) == ("max_iterations", iterations), run.outcome_detail
    opened = sessions_opened() - before
    # The cluster's own processes (sentinel, pusher, monitor, the worker's threads) open a few (6
    # seen); without a pool every iteration adds at least one more (31 seen, 19 for 12 iterations).
    assert opened < 12, f"{opened} sessions for {iterations} iterations"


def test_the_web_process_does_not_pool_a_server_that_does_not_answer_is_a_503_at_once(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = (
        # A pool's wait made long (60 s), so that not waiting shows whatever the machine's load.
        "from tether import dbpool; dbpool.WAIT_SECONDS = 60.0\n"
        "import json, time, django; django.setup()\n"
        "from django.test import Client\n"
        "began = time.monotonic(); response = Client().get('/readyz')\n"
        "print(json.dumps([response.status_code, time.monotonic() - began, response.json()['checks']['database']]))\n"
    )
    env = {
        **os.environ, "TETHER_HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "tether.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/tether", "TETHER_DB_POOL": "40",
        "TETHER_WEB_DB_WAIT_SECONDS": "60",
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    status, seconds, said = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 503 and said.startswith("failed"), (status, said)
    assert seconds < 30, seconds  # a pool would have waited for a connection (60 s here) on every check


class WritingBrain:
    """An act that writes through `dbfaults.retry`, as its meter and journal do, and reads plainly, as a
    credential is read, then runs a program; it says whether the thread still held a connection after
    each (what the model call or the program would sit on)."""

    def __init__(self, instance):
        self.instance = instance

    def act(self, request):
        from instances import sandbox
        from instances.brains import process
        from instances.brains.base import Reply, Usage
        from tether import dbfaults

        dbfaults.retry(lambda: Run.objects.filter(pk=request.run_id).count(), what="an act's write")
        after_write = connection.connection is not None
        Run.objects.filter(pk=request.run_id).exists()  # a plain read, outside `retry`
        spec = sandbox.Spec(workspace=request.workspace, instance_id=self.instance.pk)
        request.workspace.mkdir(parents=True, exist_ok=True)
        process.run(["true"], cwd=request.workspace, env=process.base_env(request.workspace), timeout=30, spec=spec)
        during_program = connection.connection is not None
        said = " ".join("held" if held else "given back" for held in (after_write, during_program))
        return Reply(ok=True, text=said, usage=Usage(), detail="")


@postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("gated", "said"), [(True, "given back given back"), (False, "held held")])
def test_a_run_that_gives_its_connection_back_holds_none_through_its_act(user, settings, pooled, gated, said):
    from loops import runner

    run, lease = claimed_run(user, settings, "tests.ops.test_db_pool.WritingBrain", iterations=1, gated=gated)
    runner.drive(lease, slice_seconds=3600)
    finished = Run.objects.get(pk=run.pk)
    assert finished.iterations_done == 1
    response = finished.iterations.get(number=1).response
    assert response == said  # a kept connection stays kept; a run that gives its back keeps none through the act


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_without_a_pool_an_act_keeps_the_connection_it_opens(user, settings):
    """Without a pool, giving a connection back costs a new server process each time: the act keeps its."""
    from loops import runner

    run, lease = claimed_run(user, settings, "tests.ops.test_db_pool.WritingBrain", iterations=1, gated=True)
    runner.drive(lease, slice_seconds=3600)
    assert Run.objects.get(pk=run.pk).iterations.get(number=1).response == "held held"
