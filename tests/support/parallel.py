"""A pytest plugin (`-p tests.support.parallel`, in pyproject's addopts): each pytest-xdist worker
gets its own corner of the machine.

It runs as pytest starts, before pytest-django loads the settings (a conftest is too late), and sets
the environment the settings and every process a test starts (daphne, qcluster, serve) read:
- TETHER_HOME: the worker's own home (secret key, workspaces, the workers' status cache, sockets);
- REDIS_URL: a Redis database of its own (the ones after REDIS_URL's), since channel groups (`run.1`)
  and cache keys are named by database ids, which every worker's test database reuses;
- TETHER_SANDBOX_UID_BASE: sandbox uids of its own (an instance runs as the base + its id).
The test database gets its own name from pytest-django (`..._gw0`). Without xdist nothing changes.
"""

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis's default `databases`


def worker_redis_url(url: str, index: int) -> str:
    """The Redis database of xdist worker `index`: the ones after the run's own (REDIS_URL's, 0 if it names none).

    Channel groups (`run.1`) and the workers' status cache are named by database ids, which every
    worker's test database reuses, so each worker talks to a Redis database of its own. Counted from
    the run's database, not from 0: two runs given different databases (two checkouts, or CI beside
    a developer's run) never share one. The serial run of the `alone` tests uses the run's own.
    """
    parts = urlsplit(url)
    base = parts.path.strip("/")
    try:
        first = int(base) if base else 0
    except ValueError:
        raise RuntimeError(f"REDIS_URL must name a Redis database by number, got {url!r}") from None
    number = first + index + 1
    if number >= REDIS_DATABASES:
        raise RuntimeError(
            f"gw{index}: REDIS_URL's database {first} leaves Redis databases for {REDIS_DATABASES - 1 - first}"
            " test workers; give REDIS_URL a lower database or run fewer workers"
        )
    return urlunsplit(parts._replace(path=f"/{number}"))


def _a_corner_of_its_own() -> None:
    """Point this worker's environment at its own home, Redis database and sandbox uids."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    index = int(worker[2:])
    home = os.environ.get("TETHER_HOME") or str(Path(__file__).resolve().parent.parent / "var")
    os.environ["TETHER_HOME"] = os.path.join(home, worker)
    if redis := os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = worker_redis_url(redis, index)
    # An instance's programs run as TETHER_SANDBOX_UID_BASE + its id, and ids repeat across workers.
    base = int(os.environ.get("TETHER_SANDBOX_UID_BASE", "200000"))
    os.environ["TETHER_SANDBOX_UID_BASE"] = str(base + (index + 1) * 1_000_000)


_a_corner_of_its_own()
