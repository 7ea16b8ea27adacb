"""PostgreSQL connections pooled in the processes that drive runs.

A driver's runs beyond `TETHER_CONNECTIONS_PER_WORKER` give their connection back before every act
and take one again after it (at most `TETHER_DB_GATE_PER_WORKER` at once). Without a pool each of
those is a new server process, started for one short transaction and ended right after: most of
PostgreSQL's CPU under a fleet. With `TETHER_DB_POOL` above 0 (off by default), `enable()`, called
as a django-q2 worker process starts its driver, puts that process's connections in a psycopg_pool
pool of at most that many (Django's own pool support): a connection given back stays open, is
checked when handed out again, and a thread waits at most `WAIT_SECONDS` for one before it meets a
transient fault (retried like a cut).

A pool keeps what it opened for a while (an idle connection goes after a minute, one at a time), so
its size counts against the server's `max_connections` whole: every worker process of every cluster
may hold `TETHER_DB_POOL`. It must leave room beyond the runs that keep a connection and the gate
(the heartbeat, pickup, queue claims, and the short writes of acts in flight — a metered call's
reservation, a tool call's journal — each given back at once, `dbfaults.hold_no_connection`): at
least `TETHER_CONNECTIONS_PER_WORKER + TETHER_DB_GATE_PER_WORKER + 8`.

Only those processes: the web process keeps each thread's connection (`TETHER_DB_CONN_MAX_AGE`),
which fails at once when the server does not answer (a pool's thread would wait), and the cluster's
sentinel, which forks the workers, never pools (a pool does not survive a fork).
"""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

WAIT_SECONDS = 3.0
_inherited: list[object] = []


def enabled() -> bool:
    """Whether this process's connections are pooled."""
    return bool(connections.settings[DEFAULT_DB_ALIAS].get("OPTIONS", {}).get("pool"))


def enable() -> bool:
    """Pool this process's PostgreSQL connections (before it opens any); return whether it does."""
    size = int(getattr(settings, "TETHER_DB_POOL", 0))
    configured = connections.settings[DEFAULT_DB_ALIAS]
    if size <= 0 or configured["ENGINE"] != "django.db.backends.postgresql":
        return False
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:  # a session inherited through the fork is the sentinel's:
            _inherited.append(conn.connection)  # let go, never closed from here (nor collected)
            conn.connection = None
    # Every thread's connection reads this one dict (Django's per-alias settings).
    configured["CONN_MAX_AGE"] = 0  # given back means back to the pool, not kept by the thread
    configured["OPTIONS"] = {
        **configured.get("OPTIONS", {}),
        "pool": {
            "min_size": 0, "max_size": size, "max_idle": 60.0, "timeout": WAIT_SECONDS,
            "reconnect_timeout": 1.0, "name": "tether-driver",
        },
    }
    return True
