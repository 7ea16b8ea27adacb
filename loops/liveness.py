"""Is a lease's holder still alive? Drivers beat; a stop asks before waiting for a lease.

A lease says who drives a run (`host:pid`) and until when, but its expiry is renewed only
every third of TETHER_LEASE_SECONDS, too seldom to tell a dead worker from a live one in
time for a person pressing Stop. So every driver's heartbeat also beats here, in the cache
all processes share (Q_CLUSTER["cache"]: Redis in the scale-out shape, files under
TETHER_HOME otherwise), about once a second, with the runs it drives. A holder is gone when it ran on this machine
and its process no longer exists, or when its beat has been silent for
TETHER_HOLDER_SILENT_SECONDS (read only where the cache is shared: on this machine, or
everywhere when TETHER_BEATS_SHARED, true with REDIS_URL). Anything unknown (the cache cannot be read, another machine without a
shared cache) counts as alive: a stop then waits for the lease, as it always could.
The reaper asks the other way round (`still_driving`): a run whose lease expired while its
holder lives and still beats for it lost renewals to a cut connection, not its driver.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import caches

log = logging.getLogger(__name__)


def _cache():
    return caches[settings.Q_CLUSTER.get("cache", "default")]


def _key(holder: str) -> str:
    return f"tether-driver-beat:{holder}"


def beat(holder: str, runs: Iterable[int] = ()) -> None:
    """Say that `holder` (a driver, `host:pid`) is alive now and drives `runs`."""
    silent = settings.TETHER_HOLDER_SILENT_SECONDS
    _cache().set(_key(holder), {"at": time.time(), "runs": sorted(runs)}, timeout=max(int(silent * 4), 10))


def _recent_beat(holder: str) -> dict[str, Any] | None:
    """The holder's last beat if it is recent; None when there is none or it fell silent.

    Raises when the cache cannot be read.
    """
    last = _cache().get(_key(holder))
    if last is None:
        return None
    last = last if isinstance(last, dict) else {"at": float(last), "runs": []}
    return None if time.time() - last["at"] > settings.TETHER_HOLDER_SILENT_SECONDS else last


def _in_sight(holder: str) -> tuple[bool, bool]:
    """Return (whether `holder`'s liveness can be judged here, whether its process is known dead)."""
    host, _, pid = holder.rpartition(":")
    if not host or not pid.isdigit():
        return False, False
    if host == socket.gethostname():
        return True, not _process_alive(int(pid))
    return bool(settings.TETHER_BEATS_SHARED), False  # else its beats are in its own machine's cache


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:  # a killed process nobody has reaped yet is a zombie: dead all the same
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def holder_gone(holder: str) -> bool:
    """Return True when the driver `holder` is known to be dead (never guesses: unknown is alive)."""
    judged, dead = _in_sight(holder)
    if dead or not judged:
        return dead
    try:
        return _recent_beat(holder) is None
    except Exception:
        log.warning("driver beats unreadable; treating %s as alive", holder, exc_info=True)
        return False


def still_driving(holder: str, run_id: int) -> bool:
    """Return True when `holder` is known alive and, by its last beat, still drives `run_id`.

    A lease can expire while its driver lives: its connection was cut and the renewals
    failed. The reaper leaves such a run alone; the driver renews when it reconnects.
    """
    judged, dead = _in_sight(holder)
    if dead or not judged:
        return False
    try:
        last = _recent_beat(holder)
    except Exception:
        return False  # unknown: the reaper does what it always did
    return last is not None and run_id in last.get("runs", ())
