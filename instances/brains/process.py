"""Run one external program under Tether's rules: in the sandbox (`instances.sandbox`),
scrubbed environment, stdin in, capped stdout/stderr out, killed (its whole process
group, and with it the sandbox) at a timeout or when a stop is requested. Used by the
`command` brain and by checks.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from instances import sandbox
from tether import dbfaults
from tether.storable import storable

# What a program may see of the platform's own environment: nothing but a search
# path (the system's, plus the interpreter Tether runs on) and a locale.
SAFE_PATH = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])


# A program must not outlive the worker that started it (a SIGKILLed worker would
# otherwise leave an agent editing the workspace while another worker retries).
SETPRIV = shutil.which("setpriv")


def base_env(home: Path) -> dict[str, str]:
    # HOME is the workspace, so Python's user site (HOME/.local/...) would be the agent's to write:
    # a `usercustomize.py` there would run inside every check. PYTHONNOUSERSITE turns it off.
    # Bytecode is cached in the sandbox's own /tmp, never read from the workspace's __pycache__:
    # a stale .pyc (a file rewritten within the second, at the same size) or one an agent forged
    # would otherwise be run in place of the source the checks are meant to test.
    return {
        "PATH": SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "PYTHONNOUSERSITE": "1", "PYTHONPYCACHEPREFIX": "/tmp/pycache",
    }


@dataclass
class Finished:
    exit_code: int | None
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    stopped: bool = False
    spawn_error: str = ""
    sandboxed: bool = False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdin: str = "",
    timeout: float,
    stop: threading.Event | None = None,
    cap: int = 64 * 1024,
    poll: float = 0.05,
    spec: sandbox.Spec,
) -> Finished:
    """Run `argv` in the sandbox `spec` describes to completion, a timeout or a stop.

    Never raises for the program's own failure; a sandbox that cannot be set up is a
    `spawn_error` (the program does not run).
    """
    dbfaults.give_back()  # a run that holds no connection between its writes holds none while its program runs
    started = time.monotonic()
    spawned = _spawn(argv, cwd=cwd, env=env, spec=spec)
    if isinstance(spawned, Finished):
        return spawned
    proc, sandboxed = spawned
    out, err = bytearray(), bytearray()
    timed_out, stopped = _pump(
        proc, stdin.encode(), out, err, cap=cap, poll=poll, stop=stop, deadline=started + timeout
    )
    return Finished(
        exit_code=proc.returncode,
        stdout=storable(out.decode(errors="replace")),  # a program may print a NUL: the run's records cannot hold one
        stderr=storable(err.decode(errors="replace")),
        duration=time.monotonic() - started,
        timed_out=timed_out,
        stopped=stopped,
        sandboxed=sandboxed,
    )


def _spawn(
    argv: list[str], *, cwd: Path, env: dict[str, str], spec: sandbox.Spec
) -> tuple[subprocess.Popen[bytes], bool] | Finished:
    """Start `argv` with piped stdin, stdout and stderr; return (the process, sandboxed), or a spawn error."""
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if program is None or not os.access(cwd / program if not os.path.isabs(program) else program, os.X_OK):
        return Finished(None, "", "", 0.0, spawn_error=f"could not start {argv[0]!r}: not found or not executable")
    if SETPRIV and not sandbox.enabled():
        argv = [SETPRIV, "--pdeathsig", "KILL", "--", program, *argv[1:]]
    try:
        return sandbox.spawn(
            argv, spec, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except sandbox.SandboxUnavailable as exc:
        return Finished(None, "", "", 0.0, spawn_error=f"refused to run {argv[0]!r}: {exc}")
    except OSError as exc:
        return Finished(None, "", "", 0.0, spawn_error=f"could not start {argv[0]!r}: {exc.strerror or exc}")


def _pump(
    proc: subprocess.Popen[bytes],
    pending: bytes,
    out: bytearray,
    err: bytearray,
    *,
    cap: int,
    poll: float,
    stop: threading.Event | None,
    deadline: float,
) -> tuple[bool, bool]:
    """Feed `pending` to the program and keep up to `cap` bytes of each output until it ends; return (timed_out, stopped).

    A stop or the deadline kills it; either way the program's whole group is ended and reaped.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    pipes = (proc.stdin, proc.stdout, proc.stderr)
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    selector = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        selector.register(stream.fileno(), selectors.EVENT_READ)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    exit_fd = os.pidfd_open(proc.pid)
    selector.register(exit_fd, selectors.EVENT_READ)
    timed_out = stopped = exited = False
    exited_at = 0.0
    try:
        # One thread multiplexes the program's pipes and its exit, waking at least
        # every `poll` seconds to look at the stop signal and the deadline.
        while True:
            for key, _ in selector.select(timeout=poll):
                if key.fd == exit_fd:
                    exited = True
                    exited_at = time.monotonic()
                    selector.unregister(exit_fd)
                else:
                    pending = _transfer(proc, selector, sinks, key.fd, pending, cap)
            if exited and not sinks:
                break
            if exited and time.monotonic() - exited_at > 0.5:
                break  # the program is gone but something it started holds its pipes
            if not exited and stop is not None and stop.is_set():
                stopped = True
            elif not exited and time.monotonic() >= deadline:
                timed_out = True
            else:
                continue
            _kill(proc)
            break
    finally:
        selector.close()
        os.close(exit_fd)
        # The group may hold children that still write; end them with their leader.
        _kill(proc)
        proc.wait()
        for stream in pipes:
            if not stream.closed:
                stream.close()
    return timed_out, stopped


def _transfer(
    proc: subprocess.Popen[bytes],
    selector: selectors.BaseSelector,
    sinks: dict[int, bytearray],
    fd: int,
    pending: bytes,
    cap: int,
) -> bytes:
    """Move what `fd` is ready for: read an output into its sink (to `cap`), or write stdin; return what is left to write."""
    if fd in sinks:
        chunk = os.read(fd, 65536)
        if chunk:
            room = cap - len(sinks[fd])
            if room > 0:
                sinks[fd].extend(chunk[:room])
        else:
            selector.unregister(fd)
            del sinks[fd]
        return pending
    assert proc.stdin is not None
    try:
        written = os.write(fd, pending[:65536])
        pending = pending[written:]
    except (BrokenPipeError, OSError):
        pending = b""
    if not pending:
        selector.unregister(fd)
        proc.stdin.close()
    return pending
