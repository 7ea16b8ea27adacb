"""Transient database faults: which errors pass, and retrying a short transaction through them.

A connection cut (`pg_terminate_backend`, a restarted server, a dropped socket), a
serialization failure, a deadlock or a lock timeout says nothing about the work: the same
transaction, retried on a fresh connection, succeeds. `is_transient` names those errors;
`retry` closes the broken connection and runs a callable again with bounded backoff until
it succeeds, a non-transient error is raised, or `TETHER_DB_RETRY_SECONDS` pass. Only a
callable that is one whole transaction (or a read) may be retried: `retry` refuses to act
inside an outer `atomic()` block, whose work a reconnect would lose.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

log = logging.getLogger(__name__)

# PostgreSQL SQLSTATE classes and codes that a retry on a fresh connection can get past.
_TRANSIENT_CLASSES = ("08", "40", "53")  # connection exception, transaction rollback, insufficient resources
# admin or crash shutdown, cannot connect now, lock timeout
_TRANSIENT_CODES = ("57P01", "57P02", "57P03", "55P03")
# SQLite's busy writer, and what a dropped connection says where no SQLSTATE is given.
_TRANSIENT_MESSAGES = ("database is locked", "database table is locked", "database is busy", "connection")

FIRST_DELAY = 0.05
MAX_DELAY = 2.0


def is_transient(exc: BaseException) -> bool:
    """Return True when `exc` is a database error a retry on a fresh connection can get past."""
    if isinstance(exc, InterfaceError):
        return True  # "connection already closed": the connection died under us
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__ or exc
    state = getattr(cause, "sqlstate", None)
    if state:
        return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES
    if type(cause).__module__.startswith("psycopg"):
        return True  # psycopg reports the loss of the socket itself without a SQLSTATE
    message = str(cause).lower()
    return any(text in message for text in _TRANSIENT_MESSAGES)


def is_busy(exc: BaseException) -> bool:
    """Return True when `exc` says every connection Tether may use is at work, not that the database is down.

    A pool's wait that ran out (`PoolTimeout`: `tether.dbpool`), a pool's queue that is full
    (`TooManyRequests`), or the server's own "too many clients" (53300): the database answers, and
    a retry in a moment will find room. Every one of them is also transient (`is_transient`).
    """
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) == "53300":
        return True
    try:
        from psycopg_pool import PoolTimeout, TooManyRequests  # lazy: PostgreSQL's only
    except ImportError:  # pragma: no cover (installed with psycopg[pool])
        return False
    return isinstance(cause, PoolTimeout | TooManyRequests)


def reset() -> None:
    """Drop this thread's (probably broken) connection; the next query opens a new one."""
    try:
        connection.close()
    except Exception:  # closing a dead socket may fail; Django drops the handle either way
        log.debug("closing a broken connection failed", exc_info=True)


_thread = threading.local()


def hold_no_connection(on: bool) -> None:
    """From now on (`on`), this thread gives its connection back after each transaction `retry` runs,
    and wherever `give_back` is called (before a program or a model call that may take long).

    For a run that gives its connection back before its act, to a pool: what the act and its
    decider read and write meanwhile (a model call's reservation and settle, a tool call's journal,
    a credential) must not keep a connection through the model call or the program that follows.
    """
    _thread.holds_none = on


def give_back() -> None:
    """Close this thread's connection if it holds none between its transactions (`hold_no_connection`)."""
    if getattr(_thread, "holds_none", False) and not connection.in_atomic_block:
        connection.close()


def retry[T](fn: Callable[[], T], *, what: str, seconds: float | None = None) -> T:
    """Call `fn` until it returns, retrying transient database errors on a fresh connection.

    `fn` must be a whole transaction or a read (it runs again from the start). Gives up by
    raising the last error after `seconds` (TETHER_DB_RETRY_SECONDS), and at once inside an
    outer transaction. Gives the connection back after it, if this thread holds none.
    """
    try:
        return _retry(fn, what, settings.TETHER_DB_RETRY_SECONDS if seconds is None else seconds)
    finally:
        give_back()


def _retry[T](fn: Callable[[], T], what: str, seconds: float) -> T:
    ends = time.monotonic() + seconds
    delay = FIRST_DELAY
    tries = 0
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError) as exc:
            tries += 1
            if not is_transient(exc) or connection.in_atomic_block:
                raise
            if time.monotonic() + delay > ends:
                log.warning("%s: database still failing after %s tries; giving up: %s", what, tries, exc)
                raise
            log.warning(
                "%s: transient database error (%s: %s); reconnecting, try %s in %.2fs",
                what,
                type(exc).__name__,
                str(exc).strip()[:200],
                tries + 1,
                delay,
            )
            reset()
            time.sleep(delay * random.uniform(0.75, 1.25))
            delay = min(delay * 2, MAX_DELAY)


def ensure_usable(*, what: str) -> None:
    """Make sure this thread's connection answers, reconnecting if it died while idle (say, during an act).

    A server's connection can be cut while it idles; an embedded SQLite file's cannot, so it is not asked.
    """
    if connection.in_atomic_block or connection.connection is None or connection.vendor == "sqlite":
        return  # nothing open to check (the next query connects afresh), or nothing that can be cut

    def ping() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    retry(ping, what=what)
