"""One connection budget, stated and enforced; a burst is queued, not refused; busy is not an outage.

Every PostgreSQL connection a web or worker process holds comes from a bounded pool, the sum is
worked out in one place (`tether.dbpool.budget`), printed by `serve` and checked against the
server's max_connections. A request that waits its bound for a connection answers 503 "busy" with
Retry-After; a database that does not answer keeps the outage message, at once.
"""

import json
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import OperationalError, connection, connections
from django.test import Client

from tether import dbfaults, dbpool, middleware
from web.auth import make_token

ROOT = Path(__file__).resolve().parents[2]
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a pool and max_connections are PostgreSQL's"
)


def wrapped(cause: BaseException) -> OperationalError:
    """`cause` as Django raises it (`wrap_database_errors`)."""
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


# --- the budget --------------------------------------------------------------------------------


def test_the_budget_adds_every_pool_in_one_place(settings):
    settings.TETHER_WEB_DB_POOL, settings.TETHER_WORKERS, settings.TETHER_DB_POOL = 16, 2, 32
    settings.TETHER_DB_RESERVE = 5
    both = dbpool.budget()
    assert both.total == 16 + 2 * 32 + dbpool.CLUSTER_OWN + 5
    assert "TETHER_WEB_DB_POOL" in both.describe() and "TETHER_WORKERS × TETHER_DB_POOL" in both.describe()
    assert dbpool.budget(workers=False).total == 16 + 5  # serve --web-only
    assert dbpool.budget(web=False).total == 2 * 32 + dbpool.CLUSTER_OWN + 5  # serve --workers-only
    assert both.bounded
    settings.TETHER_DB_POOL = 0  # worker processes that do not pool: an estimate, said to be one
    assert not dbpool.budget().bounded


def test_behind_pgbouncer_the_budget_is_pgbouncers_to_allow_not_the_servers(settings):
    settings.TETHER_DB_PGBOUNCER, settings.TETHER_WEB_DB_POOL = True, 100_000  # far past any max_connections
    fits, said = dbpool.check(dbpool.budget())
    assert fits and "through PgBouncer" in said and "max_client_conn" in said and "100000" in said


def test_a_worker_process_pools_by_default(settings):
    from tether import settings as tether_settings

    assert (
        tether_settings.TETHER_DB_POOL
        == (tether_settings.TETHER_CONNECTIONS_PER_WORKER + tether_settings.TETHER_DB_GATE_PER_WORKER + 8)
        or "TETHER_DB_POOL" in os.environ
    )


# --- busy is not an outage ---------------------------------------------------------------------


def test_a_pools_timeout_is_busy_and_a_refused_connection_is_an_outage():
    import psycopg
    from psycopg_pool import PoolTimeout, TooManyRequests

    for busy in (PoolTimeout("couldn't get a connection after 10.00 sec"), TooManyRequests("64 waiting")):
        assert dbfaults.is_busy(wrapped(busy)) and dbfaults.is_transient(wrapped(busy))
    full = psycopg.errors.TooManyConnections("sorry, too many clients already")
    assert dbfaults.is_busy(wrapped(full))
    down = psycopg.OperationalError("connection failed: Connection refused")
    assert dbfaults.is_transient(wrapped(down)) and not dbfaults.is_busy(wrapped(down))
    assert not dbfaults.is_busy(wrapped(Exception("database is locked")))


@pytest.fixture
def start_url(user, make_instance):
    instance = make_instance(user, max_iterations=1)
    return f"/v1/instances/{instance.pk}/loop", {"Authorization": f"Bearer {make_token(user)}"}


@pytest.mark.django_db(transaction=True)
def test_a_request_that_meets_a_pools_timeout_answers_503_busy_with_retry_after(start_url, user):
    """On either database, as the middleware sees it: the pool's timeout raised where the request connects."""
    from psycopg_pool import PoolTimeout

    url, auth = start_url

    def no_connection_free(execute, sql, params, many, context):
        raise wrapped(PoolTimeout("couldn't get a connection after 10.00 sec"))

    client = Client(raise_request_exception=False)
    client.force_login(user)
    with connection.execute_wrapper(no_connection_free):
        response = client.post(url, {"objective": "go"}, content_type="application/json", headers=auth)
        page = client.get("/", headers={"Accept": "text/html"})
    assert response.status_code == 503
    assert response.json()["error"] == middleware.BUSY_MESSAGE and "busy" in middleware.BUSY_MESSAGE
    assert int(response["Retry-After"]) > 0
    assert (
        page.status_code == 503
        and "busy" in page.content.decode()
        and "reconnecting" not in page.content.decode()
    )
    assert (
        client.post(url, {"objective": "go"}, content_type="application/json", headers=auth).status_code
        == 201
    )


@pytest.fixture
def web_pool(settings):
    """This process's connections pooled as a web process's are (`dbpool.enable_web`): 2, a short wait."""
    settings.TETHER_WEB_DB_POOL, settings.TETHER_WEB_DB_WAIT_SECONDS = 2, 0.5
    configured = connections.settings["default"]
    saved = (configured["CONN_MAX_AGE"], dict(configured.get("OPTIONS", {})))
    connections.close_all()
    assert dbpool.enable_web(in_tests=True)
    yield
    connections.close_all()
    connection.close_pool()
    configured["CONN_MAX_AGE"], configured["OPTIONS"] = saved


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_start_that_cannot_get_a_connection_within_the_bound_answers_503_busy(start_url, web_pool):
    url, auth = start_url
    holding, release = threading.Barrier(3), threading.Event()

    def hold():  # a request in flight, holding one of the web process's connections
        connection.ensure_connection()
        holding.wait(10)
        release.wait(30)
        connection.close()  # back to the pool

    holders = [
        threading.Thread(target=hold, daemon=True) for _ in range(2)
    ]  # never keep pytest alive at exit
    for holder in holders:
        holder.start()
    try:
        holding.wait(10)
        client = Client(raise_request_exception=False)
        response = client.post(url, {"objective": "go"}, content_type="application/json", headers=auth)
        stats = connection.pool.get_stats()
    finally:
        release.set()
        for holder in holders:
            holder.join(10)
    assert response.status_code == 503, response.content[:300]
    assert response.json()["error"] == middleware.BUSY_MESSAGE
    assert int(response["Retry-After"]) > 0
    # It queued for a connection and its wait ran out (the pool's own counters: no clock in a test).
    assert stats.get("requests_queued", 0) >= 1 and stats.get("requests_errors", 0) >= 1, stats
    again = client.post(url, {"objective": "go"}, content_type="application/json", headers=auth)
    assert again.status_code == 201, again.content[:300]  # connections given back: served from the pool


def test_a_pooled_web_process_answers_a_database_that_is_down_with_the_outage_message_at_once(tmp_path):
    """A pool whose wait is an hour: the outage answer does not come from that wait running out (the
    subprocess would not end), but from the failed attempts to connect, at once."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = (
        "import json, time, django; django.setup()\n"
        "from tether import dbpool; assert dbpool.enable_web()\n"
        "from django.test import Client\n"
        "client, said = Client(raise_request_exception=False), []\n"
        "for _ in range(3):\n"
        "    began = time.monotonic()\n"
        "    r = client.post('/v1/instances/1/loop', '{}', content_type='application/json',"
        " headers={'Authorization': 'Bearer tth_x'})\n"
        "    said.append([r.status_code, time.monotonic() - began, r.json().get('error', ''), r.get('Retry-After')])\n"
        "print(json.dumps(said))\n"
    )
    env = {
        **os.environ,
        "TETHER_HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "tether.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/tether",
        "TETHER_WEB_DB_WAIT_SECONDS": "3600",
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for status, _seconds, error, retry_after in json.loads(done.stdout.strip().splitlines()[-1]):
        # the outage's message, not "busy"
        assert (status, error) == (503, middleware.MESSAGE), (status, error)
        assert int(retry_after) > 0


# --- serve states the budget and refuses one that does not fit -------------------------------------


def serve_env(**more: str) -> dict[str, str]:
    from tests.support.cluster import worker_env

    return worker_env(**more)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_serve_refuses_to_start_when_the_budget_does_not_fit_max_connections_naming_the_settings():
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "serve", "--no-migrate", "--port", "1"],
        cwd=ROOT, env=serve_env(TETHER_WEB_DB_POOL="100000"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    said = done.stderr + done.stdout
    assert "do not fit" in said and "max_connections" in said, said[-2000:]
    for name in ("TETHER_WEB_DB_POOL", "TETHER_WORKERS", "TETHER_DB_POOL", "TETHER_DB_RESERVE"):
        assert name in said, (name, said[-2000:])


def test_serve_says_so_when_it_cannot_reach_the_database_to_check_the_budget(tmp_path):
    """A database that does not answer yet is a warning naming the budget left unchecked, not a traceback
    from the check (what follows is as before: here `migrate` fails, as it did without the check)."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "TETHER_HOME": str(tmp_path),
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/tether",
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "serve", "--port", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = done.stderr + done.stdout
    assert "could not reach its database to check its connection budget" in said, said[-2000:]
    assert "TETHER_WEB_DB_POOL" in said and "dbpool.py" not in said, said[-2000:]


APP_NAME = "tether-burst-under-test"  # the serve's own connections, told from every other on the server


def backends_now(admin, dbname: str) -> tuple[int, int]:
    """(this serve's connections to the test database, client connections on the whole server)."""
    row = admin.execute(
        "SELECT count(*) FILTER (WHERE datname = %s AND application_name = %s), count(*)"
        " FROM pg_stat_activity WHERE backend_type = 'client backend'",
        (dbname, APP_NAME),
    ).fetchone()
    return int(row[0]), int(row[1])


@postgresql_only
@pytest.mark.slow
@pytest.mark.alone  # its serve's budget is 84 of PostgreSQL's 100 connections: not beside other workers' servers
@pytest.mark.django_db(transaction=True)
def test_two_hundred_starts_from_sixty_four_threads_all_start_within_the_budget(
    user, make_instance, tmp_path, settings
):
    """On the default settings but two worker processes, 200 starts from 64 threads at once: every one
    starts (a start queues for a connection, it is not refused), and the serve's PostgreSQL connections
    (pg_stat_activity, sampled through the burst) never pass its budget, which fits the server's
    max_connections, and the server's never reach max_connections. Behaviour only: how fast the starts
    are answered is measured by `make load LOAD_ARGS=--burst`."""
    import http.client

    import psycopg

    from tests.console.test_herd import Serve

    instances = [make_instance(user, name=f"burst-{n}", max_iterations=1).pk for n in range(200)]
    token = make_token(user)
    settings.TETHER_WORKERS = 2  # the serve's (below), to add its budget up as it does
    held = dbpool.budget().held  # web pool + worker pools + the cluster's own: all it may hold
    db = connection.settings_dict
    admin = psycopg.connect(host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432,
                            user=db.get("USER") or "postgres", dbname="postgres", autocommit=True)  # fmt: skip
    most = int(admin.execute("SELECT current_setting('max_connections')").fetchone()[0])
    server = Serve(tmp_path, TETHER_WORKERS="2", PGAPPNAME=APP_NAME)  # libpq names every connection it opens
    peak, server_peak, sampling = [0], [0], threading.Event()

    def sample():
        while not sampling.wait(0.02):
            mine, everyone = backends_now(admin, db["NAME"])
            peak[0], server_peak[0] = max(peak[0], mine), max(server_peak[0], everyone)

    sampler = threading.Thread(target=sample, daemon=True)  # never keeps pytest alive at its exit
    sampler.start()
    gate = threading.Barrier(64)

    def starts(share):
        gate.wait(60)
        answers = []
        for instance_id in share:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)  # a bound, not a measure
            conn.request("POST", f"/v1/instances/{instance_id}/loop", body=json.dumps({"objective": "go"}),
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            body = response.read()
            answers.append((response.status, response.getheader("Retry-After"), json.loads(body or b"{}")))
            conn.close()
        return answers

    try:
        with ThreadPoolExecutor(64) as pool:
            answers = [a for share in pool.map(starts, [instances[i::64] for i in range(64)]) for a in share]
    finally:
        sampling.set()
        sampler.join(10)
        server.stop()
        printed = server.log_path.read_text(errors="replace")
        admin.close()
    started = [a for a in answers if a[0] == 201]
    busy = [a for a in answers if a[0] == 503 and a[2].get("error") == middleware.BUSY_MESSAGE]
    print(f"200 starts from 64 threads: {len(started)} started, {len(busy)} busy; peak {peak[0]} connections"
          f" of the serve's budget {held} ({server_peak[0]} on the server, of max_connections {most})")  # fmt: skip
    assert len(answers) == 200
    other = [a for a in answers if a not in started]
    assert not other, (len(busy), other[:5])  # none refused: not busy, not the outage's message, nothing else
    assert 0 < peak[0] <= held, f"{peak[0]} connections at the peak, of a budget of {held}"
    # ... and the budget, its reserve with it, fits the server (serve checked it before it started), and
    # the server never ran out (a full server would also have refused the sampler's own count).
    assert dbpool.budget().total <= most, (dbpool.budget().describe(), most)
    assert server_peak[0] < most, f"{server_peak[0]} client connections on the server, of {most}"
    said = f"database connections: {dbpool.budget().describe()}"  # serve said its budget as it started
    assert said in printed, printed[:2000]
