"""Tether's PostgreSQL connections: one budget, every connection from a bounded pool.

**The budget.** Every connection a Tether process can hold comes from a pool of a fixed size, so
the sum is known before anything starts, and `budget()` is the one place that adds it up:

- a web process (`enable_web`, called by `tether.asgi`): `TETHER_WEB_DB_POOL` connections. Every
  HTTP request, websocket hop and console read borrows one for as long as it runs (Django's pool
  support, `OPTIONS["pool"]`), then gives it back. A request that finds them all in use queues for
  one, up to `TETHER_WEB_DB_WAIT_SECONDS`; only then does it fail with `PoolTimeout`, which
  `tether.middleware` answers 503 "busy" with Retry-After (not the outage message: the database is
  fine, Tether's own connections are all at work);
- a worker process (`enable`, as a django-q2 worker process starts its driver): `TETHER_DB_POOL`.
  A driver's runs beyond `TETHER_CONNECTIONS_PER_WORKER` give their connection back before every
  act and take one again after it (at most `TETHER_DB_GATE_PER_WORKER` at once): from the pool,
  an open one, never a new server process. The pool must leave room beyond the runs that keep a
  connection and the gate (the heartbeat, pickup, queue claims, and the short writes of acts in
  flight — a metered call's reservation, a tool call's journal — each given back at once,
  `dbfaults.hold_no_connection`): at least `TETHER_CONNECTIONS_PER_WORKER + TETHER_DB_GATE_PER_WORKER
  + 8`, which is its default. A worker's thread waits at most `WAIT_SECONDS` for one, then meets a
  transient fault (retried like a cut);
- a worker cluster's own processes (the `qcluster` command, its sentinel, pusher and monitor: one
  thread each, one plain connection each, `CLUSTER_OWN`). The sentinel forks the workers, so it
  never pools (a pool does not survive a fork);
- `TETHER_DB_RESERVE` (5) kept free for an operator's commands (`manage.py loginlink`, `migrate`,
  psql).

`manage.py serve` prints the budget as it starts and refuses to start, naming the settings, when it
does not fit the server's `max_connections` (less the slots kept for superusers, for a role that is
not one). A pool keeps what it opened for a while (an idle connection goes after a minute), so its
whole size counts.

**A pool that tells an outage from a crowd** (`TetherPool`). A plain pool answers a database that
does not answer the way it answers a busy one: its client waits out the whole timeout. Here, a
failed attempt to open a connection (other than the server's "too many clients") fails every
client waiting at once, with the server's own error; while the last attempt failed, each new
client first tries to connect itself (one at a time), so an outage is an error at once, and the
first success puts the pool back to work. A timeout while the server does not answer says so too.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

WAIT_SECONDS = 3.0
# The worker cluster's own processes, each one connection: the qcluster command, its sentinel, the
# pusher (the ORM broker's polls) and the monitor (task results).
CLUSTER_OWN = 4
_inherited: list[object] = []


def _pool_class() -> type:
    """`TetherPool`, defined on first use (psycopg_pool is imported only on PostgreSQL)."""
    global _TetherPool
    if _TetherPool is None:
        _TetherPool = _define_pool()
    return _TetherPool


_TetherPool: type | None = None


def _define_pool() -> type:
    import psycopg  # lazy: PostgreSQL's driver, only loaded when a pool is defined
    from psycopg_pool import ConnectionPool, PoolTimeout  # lazy: as psycopg

    class TetherPool(ConnectionPool):  # type: ignore[type-arg]
        """A psycopg_pool pool whose clients hear of an outage at once (see the module doc)."""

        # Set on the instance once something happens (the pool is built by Django, then given this class).
        tether_failed_at = 0.0  # monotonic time of the last failed attempt to connect; 0 after a success
        tether_error = ""
        tether_probing: threading.Lock | None = None

        def _connect(self, timeout: float | None = None) -> Any:
            try:
                conn = super()._connect(timeout)
            except Exception as exc:
                if not _server_full(exc):
                    self.tether_failed_at, self.tether_error = time.monotonic(), str(exc).strip()[:300]
                    self._fail_waiting()
                raise
            self.tether_failed_at = 0.0
            return conn

        def _fail_waiting(self) -> None:
            """Fail every client waiting for a connection: none is coming from a server that does not answer."""
            lock, waiting = getattr(self, "_lock", None), getattr(self, "_waiting", None)
            if lock is None or waiting is None:
                return
            with lock:
                failed = list(waiting)
                waiting.clear()
            for client in failed:
                client.fail(psycopg.OperationalError(f"the database does not answer: {self.tether_error}"))

        def getconn(self, timeout: float | None = None) -> Any:
            if self.tether_failed_at:
                self._probe(self.timeout if timeout is None else timeout)
            try:
                return super().getconn(timeout)
            except PoolTimeout:
                if self.tether_failed_at:  # not a crowd: the server stopped answering meanwhile
                    raise psycopg.OperationalError(
                        f"the database does not answer: {self.tether_error}"
                    ) from None
                raise

        def _probe(self, timeout: float) -> None:
            """While the last attempt failed: connect here, one client at a time, and raise what the server says."""
            lock = self.__dict__.setdefault("tether_probing", threading.Lock())
            if not lock.acquire(timeout=max(0.0, timeout)):
                raise psycopg.OperationalError(f"the database does not answer: {self.tether_error}")
            try:
                if not self.tether_failed_at:
                    return  # another client's probe found it back
                probe = self._connect(timeout=min(timeout, 5.0) or None)  # raises, and records, if it fails
                probe.close()
            finally:
                lock.release()

    return TetherPool


def _server_full(exc: BaseException) -> bool:
    """PostgreSQL's "too many clients" (53300): the server answers, it has no room."""
    return getattr(exc, "sqlstate", None) == "53300"


def enabled() -> bool:
    """Whether this process's connections are pooled."""
    return bool(connections.settings[DEFAULT_DB_ALIAS].get("OPTIONS", {}).get("pool"))


def _install(size: int, wait: float, name: str, min_size: int) -> bool:
    """Pool this process's PostgreSQL connections (before it opens any), at most `size`; return whether it does."""
    configured = connections.settings[DEFAULT_DB_ALIAS]
    if size <= 0 or configured["ENGINE"] != "django.db.backends.postgresql":
        return False
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:  # a session inherited through a fork is the parent's:
            _inherited.append(conn.connection)  # let go, never closed from here (nor collected)
            conn.connection = None
    # Every thread's connection reads this one dict (Django's per-alias settings).
    configured["CONN_MAX_AGE"] = 0  # given back means back to the pool, not kept by the thread
    configured["OPTIONS"] = {
        **configured.get("OPTIONS", {}),
        "pool": {
            "min_size": min(min_size, size),
            "max_size": size,
            "max_idle": 60.0,
            "timeout": wait,
            "reconnect_timeout": 1.0,
            "name": name,
        },
    }
    wrapper = connections[DEFAULT_DB_ALIAS]
    pools = type(wrapper)._connection_pools
    stale = pools.pop(DEFAULT_DB_ALIAS, None)  # a pool inherited through a fork is not this process's
    if stale is not None:
        _inherited.append(stale)
    pool = wrapper.pool  # built by Django from the options above
    pool.__class__ = _pool_class()  # ... and told an outage from a crowd
    return True


def enable() -> bool:
    """Pool a worker process's connections (`TETHER_DB_POOL`); return whether it does."""
    return _install(int(settings.TETHER_DB_POOL), WAIT_SECONDS, "tether-driver", 0)


def enable_web(*, in_tests: bool = False) -> bool:
    """Pool a web process's connections (`TETHER_WEB_DB_POOL`, waiting `TETHER_WEB_DB_WAIT_SECONDS`).

    Not in a test run (unless `in_tests`), which imports the application to talk to it in-process:
    its connections are the test database's, held across tests, not a web process's.
    """
    if "pytest" in sys.modules and not in_tests:
        return False
    return _install(
        int(settings.TETHER_WEB_DB_POOL),
        float(settings.TETHER_WEB_DB_WAIT_SECONDS),
        "tether-web",
        2,
    )


# --- the budget ----------------------------------------------------------------------------------


@dataclass
class Budget:
    """What one `serve` may hold at most: (connections, what, the settings that size it) per part."""

    parts: list[tuple[int, str, str]] = field(default_factory=list)
    reserve: int = 0
    bounded: bool = True  # False when worker processes do not pool (TETHER_DB_POOL=0): an estimate

    @property
    def held(self) -> int:
        return sum(n for n, _, _ in self.parts)

    @property
    def total(self) -> int:
        return self.held + self.reserve

    def describe(self) -> str:
        said = " + ".join(f"{what} {n} ({names})" for n, what, names in self.parts) or "nothing"
        return f"{said} + {self.reserve} kept free (TETHER_DB_RESERVE) = {self.total}"

    def settings_named(self) -> str:
        names = [
            name for _, _, names in self.parts for name in names.split(" × ") if name.startswith("TETHER_")
        ]
        return ", ".join(dict.fromkeys([*names, "TETHER_DB_RESERVE"]))


def budget(*, web: bool = True, workers: bool = True) -> Budget:
    """The PostgreSQL connections one `serve` (its web process, its worker cluster, or both) may hold."""
    found = Budget(reserve=int(settings.TETHER_DB_RESERVE))
    if web:
        found.parts.append((int(settings.TETHER_WEB_DB_POOL), "web", "TETHER_WEB_DB_POOL"))
    if workers:
        processes = int(settings.TETHER_WORKERS)
        per = int(settings.TETHER_DB_POOL)
        if per <= 0:  # unpooled: what a process's runs keep, its gate and its own threads, at least
            found.bounded = False
            per = int(settings.TETHER_CONNECTIONS_PER_WORKER) + int(settings.TETHER_DB_GATE_PER_WORKER) + 8
        found.parts.append((processes * per, f"workers {processes} ×", "TETHER_WORKERS × TETHER_DB_POOL"))
        found.parts.append((CLUSTER_OWN, "the worker cluster's own processes", "fixed"))
    return found


def server_room(conn: Any = None) -> tuple[int, str]:
    """How many connections the server lets Tether's role open in all, and how that was worked out."""
    conn = conn or connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int,"
            " coalesce(current_setting('reserved_connections', true), '0')::int,"
            " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
        )
        most, for_superusers, reserved, superuser = cursor.fetchone()
    if superuser:
        return most, f"the server's max_connections ({most})"
    room = most - for_superusers - reserved
    return room, (
        f"the server's max_connections ({most}) less superuser_reserved_connections ({for_superusers})"
        f" and reserved_connections ({reserved})"
    )


def check(found: Budget, conn: Any = None) -> tuple[bool, str]:
    """Whether `found` fits the server (and the line `serve` prints about it)."""
    if settings.TETHER_DB_PGBOUNCER:  # the server's limit bounds PgBouncer's, not ours
        return True, (
            f"database connections: {found.describe()}, through PgBouncer (TETHER_DB_PGBOUNCER=1):"
            " its max_client_conn must allow them"
        )
    room, how = server_room(conn)
    said = f"database connections: {found.describe()}, of {room} ({how})"
    if not found.bounded:
        said += "; TETHER_DB_POOL=0: worker processes do not pool, so theirs is an estimate, not a bound"
    if found.total <= room:
        return True, said
    return False, (
        f"Tether's database connections do not fit the server: {found.describe()} > {room} ({how}). "
        f"Lower {found.settings_named()}, raise max_connections, or put PgBouncer in front of the "
        "server (docs/operations.md: Connection budget)."
    )
