"""A pytest plugin (`-p tests.support.parallel`, in pyproject's addopts): each pytest-xdist worker
gets its own corner of the machine.

It runs as pytest starts, before pytest-django loads the settings (a conftest is too late), and sets
the environment the settings and every process a test starts (daphne, qcluster, serve) read:
- TETHER_HOME: the worker's own home (secret key, workspaces, the workers' status cache, sockets);
- REDIS_URL: a Redis database of its own, since channel groups (`run.1`) and cache keys are named by
  database ids, which every worker's test database reuses;
- TETHER_SANDBOX_UID_BASE: sandbox uids of its own (an instance runs as the base + its id).
The test database gets its own name from pytest-django (`..._gw0`). Without xdist nothing changes.
"""

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


def _a_corner_of_its_own() -> None:
    """Point this worker's environment at its own home, Redis database and sandbox uids."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    index = int(worker[2:])
    home = os.environ.get("TETHER_HOME") or str(Path(__file__).resolve().parent.parent / "var")
    os.environ["TETHER_HOME"] = os.path.join(home, worker)
    if redis := os.environ.get("REDIS_URL"):
        # Channel groups (`run.1`) and the workers' status cache are named by database ids, which
        # every worker's database reuses: each worker talks to a Redis database of its own.
        parts = urlsplit(redis)
        if index + 1 > 15:
            raise RuntimeError(f"{worker}: Redis has 16 databases, so at most 15 test workers share it")
        os.environ["REDIS_URL"] = urlunsplit(parts._replace(path=f"/{index + 1}"))
    # An instance's programs run as TETHER_SANDBOX_UID_BASE + its id, and ids repeat across workers.
    base = int(os.environ.get("TETHER_SANDBOX_UID_BASE", "200000"))
    os.environ["TETHER_SANDBOX_UID_BASE"] = str(base + (index + 1) * 1_000_000)


_a_corner_of_its_own()
