"""PostgreSQL connections pooled per process, and a forked process's share of them.

With `TETHER_DB_POOL` above 0 (the default on PostgreSQL), Django keeps each process's connections
in a psycopg_pool pool: a connection given back — a run's before its act, a request's or a socket
read's at its end — stays open for the next thread that needs one, checked before it is handed
out, instead of costing the server a new backend process on every iteration.

A pool does not survive `fork`: its connections' sockets would be shared with the parent and its
worker threads are gone. django-q2 forks its worker processes from a sentinel that has used the
database, so a forked child forgets the pools it inherited — without closing them, which would end
the parent's sessions — and opens its own on first use.
"""

from __future__ import annotations

import os
from typing import Any

_inherited: list[Any] = []  # kept referenced in a child: never collected, so never closed from here
_registered = False


def forget_inherited() -> None:
    """In a forked child: drop the pools the parent opened, so this process opens its own."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    _inherited.extend(DatabaseWrapper._connection_pools.values())
    DatabaseWrapper._connection_pools = {}
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.vendor == "postgresql" and conn.connection is not None:
            _inherited.append(conn.connection)  # the parent's session: never used or closed here
            conn.connection = None


def register() -> None:
    """Make every process forked from this one forget the pools it inherits (once per process)."""
    global _registered
    if not _registered:
        os.register_at_fork(after_in_child=forget_inherited)
        _registered = True
