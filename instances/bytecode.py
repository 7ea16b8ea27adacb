"""Bytecode for the sandbox's Python, compiled once by the server and mounted read-only.

A sandboxed program caches bytecode under `/tmp/pycache` (`PYTHONPYCACHEPREFIX`, see
`brains.process.base_env`), so a `.pyc` an agent planted in its workspace is never run in place
of the source. That cache starts empty in every sandbox: each program compiled every module it
imported, and a check's pytest its plugins too, assertion rewriting included (pytest rewrites
every module of an installed plugin). That was most of a check's time: about 3 s of CPU per
pytest start with this interpreter's plugins, twice per pytest check (its baseline, then the check).

The server warms a cache of its own once: it runs a passing pytest session with the checks'
environment (the evidence plugin, safe-path mode) in an empty directory of its own, outside any
sandbox, with the cache prefix pointed at a directory under `TETHER_HOME`. Every sandbox then
mounts the part of it that belongs to the interpreter's own trees read-only at the same place
under `/tmp/pycache`. Nothing of an agent's goes into it and no agent can write it. Python checks
a `.pyc` against its source's mtime and size, so one made stale by an upgrade is not used (the
cache is also keyed by the interpreter and the modification times of its library directories).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from django.conf import settings

from instances import evidence
from instances.brains import process

log = logging.getLogger(__name__)

PREFIX_SEEN = "/tmp/pycache"  # where a sandboxed Python caches bytecode (brains.process.base_env)
WARM_TIMEOUT_SECONDS = 120
WARM_TEST = "def test_warm():\n    assert [1] == [1]\n"

_lock = threading.Lock()
_failed: set[str] = set()


@functools.cache  # a process's interpreter does not move; asked at every sandbox's start
def roots() -> list[str]:
    """The interpreter's own trees, read-only in every sandbox: whose bytecode the cache holds."""
    found = [sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent)]
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in found) if os.path.isdir(p)]


@functools.cache  # an upgrade of the interpreter's libraries comes with a restart
def _key() -> str:
    libraries = {sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    stamps = sorted(f"{p}:{os.stat(p).st_mtime_ns}" for p in libraries if p and os.path.isdir(p))
    return hashlib.sha256("\n".join([sys.version, *roots(), *stamps]).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(settings.TETHER_HOME) / "pycache" / _key()


def mounts() -> list[tuple[str, str]]:
    """Return (source, destination) pairs to mount read-only in a sandbox; warm the cache first if needed.

    Empty when it is turned off (`TETHER_SANDBOX_BYTECODE=0`) or could not be made (logged once):
    programs then compile what they import, each in its own sandbox.
    """
    if not settings.TETHER_SANDBOX_BYTECODE:
        return []
    ready = warm()
    if ready is None:
        return []
    pairs = []
    for root in roots():
        source = ready / root.lstrip("/")
        if source.is_dir():
            pairs.append((str(source), PREFIX_SEEN + root))
    return pairs


def warm() -> Path | None:
    """Return the warmed cache, making it if it is not there yet (once per interpreter and home)."""
    target = cache_dir()
    if target.is_dir():
        return target
    with _lock:
        if target.is_dir():
            return target
        if str(target) in _failed:
            return None
        try:
            _build(target)
        except (OSError, subprocess.SubprocessError) as exc:
            _failed.add(str(target))
            log.warning("bytecode cache for sandboxed Python not made (%s); programs compile their own", exc)
            return None
    return target


def _build(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="tether-warm-") as scratch:
            work, reports = Path(scratch) / "work", Path(scratch) / "reports"
            work.mkdir()
            reports.mkdir()
            (work / "test_warm.py").write_text(WARM_TEST)
            env = process.base_env(work)
            env.update(evidence.env(str(evidence.PLUGIN_DIR), str(reports)))
            env["PYTHONPYCACHEPREFIX"] = str(building)
            for argv in (["--collect-only", "-q"], ["-q"]):
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv],
                    cwd=work, env=env, capture_output=True, timeout=WARM_TIMEOUT_SECONDS, check=False,
                )
                if done.returncode != 0:
                    raise subprocess.SubprocessError(
                        f"pytest exited {done.returncode}: {done.stdout.decode(errors='replace')[-500:]}"
                    )
        # Only the interpreter's trees are kept: the scratch directory's own entries go.
        for child in building.iterdir():
            if not any(("/" + child.name) == root or root.startswith("/" + child.name + "/") for root in roots()):
                shutil.rmtree(child, ignore_errors=True)
        try:
            building.rename(target)  # another process may have won: then its cache is the one
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
