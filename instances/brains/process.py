"""Run one external program under Tether's rules: scrubbed environment, stdin in,
capped stdout/stderr out, killed (its whole process group) at a timeout or when
a stop is requested. Used by the `command` brain and by checks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# What a program may see of the platform's own environment: nothing but a search
# path (the system's, plus the interpreter Tether runs on) and a locale.
SAFE_PATH = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])


# A program must not outlive the worker that started it (a SIGKILLed worker would
# otherwise leave an agent editing the workspace while another worker retries).
SETPRIV = shutil.which("setpriv")


def base_env(home: Path) -> dict[str, str]:
    return {"PATH": SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


@dataclass
class Finished:
    exit_code: int | None
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    stopped: bool = False
    spawn_error: str = ""


def _drain(stream, sink: bytearray, cap: int) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        room = cap - len(sink)
        if room > 0:
            sink.extend(chunk[:room])
    stream.close()


def _kill(proc: subprocess.Popen) -> None:
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
) -> Finished:
    """Run `argv` to completion, a timeout or a stop; never raise for the program's own failure."""
    started = time.monotonic()
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if program is None or not os.access(cwd / program if not os.path.isabs(program) else program, os.X_OK):
        return Finished(None, "", "", 0.0, spawn_error=f"could not start {argv[0]!r}: not found or not executable")
    if SETPRIV:
        argv = [SETPRIV, "--pdeathsig", "KILL", "--", program, *argv[1:]]
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return Finished(None, "", "", 0.0, spawn_error=f"could not start {argv[0]!r}: {exc.strerror or exc}")
    out, err = bytearray(), bytearray()
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out, cap), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err, cap), daemon=True),
    ]
    for t in readers:
        t.start()

    def feed() -> None:
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    timed_out = stopped = False
    deadline = started + timeout
    while True:
        try:
            proc.wait(timeout=poll)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop is not None and stop.is_set():
            stopped = True
        elif time.monotonic() >= deadline:
            timed_out = True
        else:
            continue
        _kill(proc)
        proc.wait()
        break
    # The group may hold children that still write; end them with their leader.
    _kill(proc)
    for t in readers:
        t.join(timeout=1)
    return Finished(
        exit_code=proc.returncode,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
        duration=time.monotonic() - started,
        timed_out=timed_out,
        stopped=stopped,
    )
