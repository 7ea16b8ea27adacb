"""Start real `qcluster` worker processes against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(settings.BASE_DIR)


def worker_env(**overrides: str) -> dict[str, str]:
    """The environment a worker needs to reach the database this test uses."""
    env = dict(os.environ)
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{db.get('USER') or 'postgres'}@{host}:{port}/{db['NAME']}"
    else:
        env.pop("DATABASE_URL", None)
        env["TETHER_SQLITE_PATH"] = str(db["NAME"])
    env.update(
        {
            "TETHER_LEASE_SECONDS": "2",
            "TETHER_REAPER_SECONDS": "0.5",
            "TETHER_STOP_POLL_SECONDS": "0.1",
            "TETHER_QUEUE_POLL": "0.05",
            "TETHER_WORKERS": "1",
        }
    )
    env.update(overrides)
    return env


class Cluster:
    def __init__(self, name: str, log_dir: Path, **env: str) -> None:
        self.name = name
        self.log = open(log_dir / f"{name}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "qcluster"],
            cwd=ROOT,
            env=worker_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def tail(self, chars: int = 3000) -> str:
        """The end of the cluster's log, for a failing test's message."""
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL the whole cluster (master and workers) at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 10) -> None:
        """SIGTERM the cluster's master, as `manage.py serve` does; SIGKILL what is left after `grace` s.

        Only the master: django-q2's sentinel keeps SIGTERM's default action, so a SIGTERM to the
        whole group kills it at once while the master, stopping, waits on an event the dead
        sentinel was sleeping on -- forever (it was the 10 s every clustered test's teardown took).
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # the group: a worker the master left behind, or the master itself after `grace`
        self.log.close()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
