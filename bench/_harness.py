"""What the load and chaos harnesses share: throwaway databases, Tether processes, viewers, memory.

Not Tether itself: this module starts and watches real Tether processes (`qcluster`
worker clusters, daphne or `serve --web-only` web processes) on loopback, each in
its own session so a SIGKILL takes its whole process group, and follows runs the
way a browser does, through `/ws/runs/<id>/?after=SEQ`, reconnecting with the last
seq it has. Everything it starts it stops; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG_URL = "postgres://postgres@127.0.0.1:5432"
REDIS_DEFAULT = "redis://127.0.0.1:6379/0"
# The first bytes of a websocket message that carries an event (web/console/live.render_event).
EVENT_SEQ = re.compile(rb'^<div hx-swap-oob="beforeend:#run-\d+-timeline" data-seq="(\d+)"')
FINISHED = b'data-kind="run.finished"'


# --- engines -----------------------------------------------------------------------------------------


def pg_available() -> bool:
    return (
        shutil.which("pg_isready") is not None
        and subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1"], check=False).returncode == 0
    )


def psql(sql: str, db: str = "postgres") -> str:
    """Run one statement as the postgres superuser; return its unaligned output."""
    out = subprocess.run(
        ["psql", "-X", "-q", "-At", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-c", sql],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if out.returncode != 0:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


def fresh_database(name: str) -> None:
    drop_database(name)
    psql(f"CREATE DATABASE {name}")


def drop_database(name: str) -> None:
    psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
    psql(f"DROP DATABASE IF EXISTS {name}")


def redis_url() -> str | None:
    url = os.environ.get("REDIS_URL") or REDIS_DEFAULT
    try:
        import redis

        redis.Redis.from_url(url, socket_timeout=1).ping()
    except Exception:
        return None
    return url


def database_url(db: str, application_name: str) -> str:
    """A DATABASE_URL whose connections carry `application_name` (so they can be found and cut)."""
    return f"{PG_URL}/{db}?application_name={application_name}"


def base_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a Tether process in a harness: quiet logs, its own TETHER_HOME."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "TETHER_SQLITE_PATH", "DJANGO_SETTINGS_MODULE")
        and not k.startswith("TETHER_")
    }
    env.update(
        {
            "TETHER_HOME": str(home),
            "TETHER_LOG_LEVEL": "WARNING",
            "TETHER_QUEUE_LOG_LEVEL": "ERROR",
            "DJANGO_SETTINGS_MODULE": "bench.harness_settings",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def role(module: str, env: dict[str, str], *args: str, timeout: float = 600) -> Any:
    """Run `python -m module --role ...` with `env`; return the JSON its last line prints."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--role", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"{module} role {args[0]} failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def migrated_backend(backend: str, home: str, pg_db: str) -> None:
    """Point this process at a throwaway database (SQLite in `home`, or PostgreSQL `pg_db`), set Django up, migrate."""
    os.environ["TETHER_HOME"] = home
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tether.settings")
    if backend == "postgres":
        os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{pg_db}"
    else:
        os.environ.pop("DATABASE_URL", None)
        os.environ["TETHER_SQLITE_PATH"] = str(Path(home) / "bench.sqlite3")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.harness_settings")
    import django

    django.setup()


# --- processes -----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A Tether process in a session of its own, logging to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole group at once (master, workers, their agents)."""
        self.signal_group(signal.SIGKILL)
        self.proc.wait(timeout=15)

    def stop(self, grace: float = 10) -> None:
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        # Stragglers of the group (an agent a SIGTERMed worker left behind) go too.
        self.signal_group(signal.SIGKILL)
        self.log.close()

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def qcluster(name: str, env: dict[str, str], log_dir: Path) -> Proc:
    return Proc(name, [sys.executable, str(ROOT / "manage.py"), "qcluster"], env, log_dir)


def daphne(name: str, port: int, env: dict[str, str], log_dir: Path) -> Proc:
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tether.asgi:application"]
    return Proc(name, argv, env, log_dir)


def serve_web(name: str, port: int, env: dict[str, str], log_dir: Path) -> Proc:
    """`manage.py serve --web-only`: the entry point a deployment runs (daphne as its child)."""
    argv = [
        sys.executable,
        str(ROOT / "manage.py"),
        "serve",
        "--web-only",
        "--no-migrate",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return Proc(name, argv, env, log_dir)


def http_get(url: str, timeout: float = 5, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_http_ok(port: int, path: str = "/healthz", timeout: float = 60) -> None:
    wait_until(lambda: http_get(f"http://127.0.0.1:{port}{path}", 2)[0] == 200, timeout, f"{path} on :{port}")


# --- memory --------------------------------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: split after the last ')'
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def process_tree(roots: list[int], children: dict[int, list[int]] | None = None) -> list[int]:
    children = _children_map() if children is None else children
    seen: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.append(pid)
        stack.extend(children.get(pid, []))
    return seen


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, reaped_children: bool = False) -> float:
    """Return the CPU time (user + system) `pid` has used so far; 0 when it is gone.

    With `reaped_children`, add what its children that already exited used.
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def machine_cpu_seconds() -> tuple[float, float]:
    """Return (busy, total) CPU seconds of the whole machine since boot (all cores)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


def postgres_cpu_seconds() -> float:
    """Return the CPU time of PostgreSQL: live processes and the backends that already exited.

    All databases: other users of the server count too.
    """
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _status(int(entry))[0] == "postgres":
            total += cpu_seconds(int(entry), reaped_children=True)
    return total


def _status(pid: int) -> tuple[str, int]:
    """Return (name, VmRSS in KiB) of `pid`; ('', 0) when it is gone."""
    name, rss = "", 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Name:"):
                    name = line.split(None, 1)[1].strip()
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except OSError:
        return "", 0
    return name, rss


@dataclass
class MemorySample:
    tether_kib: int = 0  # Python processes: web servers, worker clusters and their workers
    agents_kib: int = 0  # what the acts run (the scripted agents and their children)
    tether_processes: int = 0
    agent_processes: int = 0


@dataclass
class MemoryWatch:
    """Sample the RSS of the process trees of `roots()` every `interval` seconds; keep the peaks."""

    roots: Callable[[], list[int]]
    interval: float = 0.5
    peak: MemorySample = field(default_factory=MemorySample)
    peak_total_kib: int = 0
    # CPU seconds each Tether process (python) has used, as last seen: their sum is the total.
    cpu: dict[int, float] = field(default_factory=dict)
    root_of: dict[int, int] = field(default_factory=dict)

    @property
    def tether_cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-watch", daemon=True)

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def cpu_by_root(self) -> dict[int, float]:
        """CPU seconds used by the Tether processes of each root's tree, as last seen."""
        out: dict[int, float] = {}
        for pid, seconds in self.cpu.items():
            root = self.root_of.get(pid, 0)
            out[root] = out.get(root, 0.0) + seconds
        return out

    def sample(self) -> MemorySample:
        now = MemorySample()
        children = _children_map()
        for root in self.roots():
            for pid in process_tree([root], children):
                name, rss = _status(pid)
                if not name:
                    continue
                if name.startswith("python") or name in ("daphne", "qcluster") or "manage" in name:
                    now.tether_kib += rss
                    now.tether_processes += 1
                    self.root_of[pid] = root
                    self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu_seconds(pid))
                else:
                    now.agents_kib += rss
                    now.agent_processes += 1
        return now

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = self.sample()
            if now.tether_kib > self.peak.tether_kib:
                self.peak.tether_kib, self.peak.tether_processes = now.tether_kib, now.tether_processes
            if now.agents_kib > self.peak.agents_kib:
                self.peak.agents_kib, self.peak.agent_processes = now.agents_kib, now.agent_processes
            self.peak_total_kib = max(self.peak_total_kib, now.tether_kib + now.agents_kib)
            self._stop.wait(self.interval)


# --- viewers ---------------------------------------------------------------------------------------------


@dataclass
class ViewerLog:
    """What one viewer of one run saw: every event seq in arrival order, and when."""

    run_id: int
    seqs: list[int] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)
    opened_at: float = 0.0  # first socket open (time.time())
    connects: int = 0
    closes: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    finished_seq: int = 0  # the seq of the run.finished event, once seen

    @property
    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "seqs": self.seqs,
            "arrived": self.arrived,
            "opened_at": self.opened_at,
            "connects": self.connects,
            "closes": self.closes,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "finished_seq": self.finished_seq,
        }


async def follow_run(
    log: ViewerLog,
    ports: list[int],
    cookie: str,
    until: Callable[[ViewerLog], bool],
    deadline: float,
    reconnect_delay: float = 0.3,
) -> None:
    """Follow `log.run_id` over the websocket until `until(log)` or `deadline` (monotonic).

    Every close (a restarted web process, a dropped socket) is followed by a reconnect,
    to the next web process in `ports`, asking for the events after the last seq seen.
    A seq seen twice is a duplicate; a jump is a gap. Like a browser, a viewer whose socket
    never opened waits longer before each new try (doubling, up to 5 s).
    """
    from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol

    loop = asyncio.get_running_loop()
    attempt = 0
    delay = reconnect_delay
    while not until(log) and time.monotonic() < deadline:
        connects_before = log.connects
        port = ports[(log.run_id + attempt) % len(ports)]
        attempt += 1
        closed: asyncio.Future[int] = loop.create_future()

        class Viewer(WebSocketClientProtocol):
            closed_future = closed  # bound now: this class belongs to this connection attempt

            def onOpen(self) -> None:  # noqa: N802 (autobahn's names)
                log.connects += 1
                if not log.opened_at:
                    log.opened_at = time.time()

            def onMessage(self, payload: bytes, isBinary: bool) -> None:  # noqa: N802, N803
                at = time.time()
                match = EVENT_SEQ.match(payload[:160])
                if not match:
                    return  # the run's state (summary, budget, chart): not an event
                seq = int(match.group(1))
                if seq <= log.last:
                    log.duplicates.append(seq)
                    return
                if seq != log.last + 1:
                    log.gaps.append((log.last, seq))
                log.seqs.append(seq)
                log.arrived.append(at)
                if FINISHED in payload[:1000]:
                    log.finished_seq = seq
                if until(log):
                    self.sendClose()

            def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:  # noqa: N802, N803
                if not self.closed_future.done():
                    self.closed_future.set_result(code or 0)

        url = f"ws://127.0.0.1:{port}/ws/runs/{log.run_id}/?after={log.last}"
        factory = WebSocketClientFactory(url, origin=f"http://127.0.0.1:{port}", headers={"Cookie": cookie})
        factory.protocol = Viewer
        factory.setProtocolOptions(openHandshakeTimeout=10, closeHandshakeTimeout=2)
        try:
            transport, _ = await asyncio.wait_for(loop.create_connection(factory, "127.0.0.1", port), 10)
        except (OSError, TimeoutError):
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)
            continue
        try:
            code = await asyncio.wait_for(closed, max(0.1, deadline - time.monotonic()))
            log.closes.append(code)
        except TimeoutError:
            transport.close()
            return
        delay = reconnect_delay if log.connects > connects_before else min(5.0, delay * 2)
        if not until(log):
            await asyncio.sleep(delay)


def run_viewers(spec_file: str, out_file: str) -> dict[str, Any]:
    """Hold one viewer per entry of the spec's runs until each saw its run finish; write their logs.

    Spec (JSON): runs (a run id per viewer), ports (web processes), cookie, seconds (deadline),
    spread (seconds over which the viewers connect). Stopped early (SIGTERM at the harness's
    deadline), it still writes what each viewer saw.
    """
    spec = json.loads(Path(spec_file).read_text())
    deadline = time.monotonic() + spec["seconds"]
    logs = [ViewerLog(run_id) for run_id in spec["runs"]]

    def write() -> None:
        Path(out_file).write_text(json.dumps([log.as_json() for log in logs]))

    signal.signal(signal.SIGTERM, lambda signum, frame: (write(), os._exit(0)))

    async def main() -> None:
        async def one(log: ViewerLog, delay: float) -> None:
            await asyncio.sleep(delay)
            await follow_run(log, spec["ports"], spec["cookie"], lambda v: v.finished_seq > 0, deadline)

        spread = float(spec.get("spread", 2.0))
        await asyncio.gather(*(one(log, spread * i / max(1, len(logs))) for i, log in enumerate(logs)))

    asyncio.run(main())
    write()
    return {"viewers": len(logs), "finished": sum(1 for log in logs if log.finished_seq)}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
