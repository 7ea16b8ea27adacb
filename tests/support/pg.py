"""PostgreSQL helpers for fault tests: cut connections the way an administrator (or a failover) does."""

import time

from django.db import connection


def _admin():
    """A separate autocommit connection to the test database, for terminating others' backends."""
    import psycopg

    db = connection.settings_dict
    return psycopg.connect(
        host=db.get("HOST") or "127.0.0.1",
        port=db.get("PORT") or 5432,
        user=db.get("USER") or "postgres",
        dbname=db["NAME"],
        autocommit=True,
    )


def terminate_backend(pid: int) -> None:
    """Terminate the server process `pid` of the test database (`pg_terminate_backend`)."""
    with _admin() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def cut(application_name: str, seconds: float, every: float = 0.05) -> int:
    """Terminate every backend named `application_name`, again and again for `seconds`; return how many."""
    terminated = 0
    with _admin() as admin:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                [application_name],
            ).fetchone()
            terminated += row[0] if row else 0
            time.sleep(every)
    return terminated
