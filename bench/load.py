"""Load harness: hundreds of concurrent runs with 2-second acts on one machine, watched live.

Not a test. For each brain asked for (`command`: a tiny script that sleeps; `sleep`: an
in-process brain registered through TETHER_BRAINS), in a throwaway database (PostgreSQL
+ Redis when 127.0.0.1 answers; SQLite with --backend sqlite), with real processes on
loopback: one `qcluster` worker cluster of TETHER_WORKERS processes, daphne web
process(es), and a viewer process holding websocket viewers on the runs:

- iteration rate: every run does N iterations whose act waits `act` seconds; the ideal
  rate is runs ÷ act. Reported three ways: while every run is live (steady window),
  per run (mean time from one iteration's end to the next's, ideal = act), and whole
  (all iterations ÷ time from the first run's start to the last run's end);
- event latency p50/p95/p99: an event's `created_at` (written, just before its commit)
  to its arrival at a websocket viewer; live events only (not the replay on connect);
- peak resident memory (VmRSS) of all Tether processes (web, clusters, worker processes),
  and separately of the agents' processes the acts run;
- database work per iteration: the queries one iteration issues (counted in-process,
  same brain), and the whole system's PostgreSQL transactions per iteration (workers,
  broker and viewers together; pg_stat_database deltas) and peak connections.

Bounded: every wait has a deadline; everything started is stopped. Loopback only.

With --burst, a fleet arrives the way it does from outside, all at once, not paced: every start is a
request to the API (`POST /v1/instances/<id>/loop`), sent from --start-threads client threads (64)
released at the same instant; as soon as they have all answered, every viewer connects at the same
instant (a herd of tabs, as after a web restart), once each, no retry. It reports refused starts
(and why: busy, outage, other) with their latency, viewers that failed to open within 10 s or got
no first message within 10 s, by error class, and (PostgreSQL) the peak of connections against
`max_connections`, sampled every 0.1 s through both bursts. The web process is `manage.py serve
--web-only`, as deployed (its connection budget, its listen backlog).

Run: python -m bench.load [--runs 200] [--iterations 5] [--act 2] [--viewers 500]
                          [--workers 2] [--clusters 1] [--web 1] [--starters 4] [--db-pool 40]
                          [--brain command,sleep] [--backend postgres] [--burst [--start-threads 64]]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import _harness as h

PG_DB = f"tether_load_{os.getpid()}"  # one per harness run: two runs never share it
USERNAME = "load"


class SleepBrain:
    """An in-process act that waits (a stand-in for a model call), then reports a little spend."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def act(self, request: Any) -> Any:
        from instances.brains.base import Reply, Usage

        seconds = float((self.instance.env or {}).get("ACT_SECONDS", "2"))
        stopped = request.stop.wait(seconds)
        request.workspace.mkdir(parents=True, exist_ok=True)
        (request.workspace / "n").write_text(str(request.iteration))
        usage = Usage(cost_micros=100)
        if stopped:
            return Reply(ok=False, text="", usage=usage, detail="stopped mid-act", stopped=True)
        goal = int((self.instance.env or {}).get("GOAL", "1"))
        if request.iteration >= goal:
            return Reply(ok=True, text=f"step {request.iteration}: done", usage=usage)
        return Reply(ok=False, text="", usage=usage, detail=f"step {request.iteration} of {goal}")


def command_agent(act: float) -> list[str]:
    """The scripted agent: wait, change the workspace, report spend; succeed at step GOAL."""
    return [
        "sh",
        "-c",
        f"sleep {act}; echo $TETHER_ITERATION > n; "
        'echo \'{"cost_usd": 0.0001}\' > "$TETHER_USAGE_FILE"; '
        'echo "step $TETHER_ITERATION"; '
        '[ "$TETHER_ITERATION" -ge "$GOAL" ] || { echo "step $TETHER_ITERATION of $GOAL" >&2; exit 1; }',
    ]


# --- roles (subprocesses with the shape's environment) ------------------------------------------------


def prepare(runs: int, iterations: int, act: float, brain: str, home: str) -> dict[str, Any]:
    """Migrate; make the user, a session for the viewers, and one instance per run."""
    h.django_setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from instances.models import Instance

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(USERNAME, password="load-pw-123")
    Instance.objects.bulk_create(
        Instance(
            owner=user,
            name=f"load-{i}",
            brain=brain,
            command=command_agent(act) if brain == "command" else [],
            env={"GOAL": str(iterations), "ACT_SECONDS": str(act)},
            workspace=str(Path(home) / "workspaces" / "ws" / str(i)),
            max_iterations=iterations,
            act_timeout_seconds=int(act * 10) + 30,
        )
        for i in range(runs)
    )
    client = Client()
    client.force_login(user)
    ids = list(Instance.objects.filter(owner=user).order_by("pk").values_list("pk", flat=True))
    from web.auth import make_token

    token = make_token(user, name="load")
    return {"cookie": f"sessionid={client.cookies['sessionid'].value}", "instances": ids, "token": token}


def start(instances_file: str, part: int = 0, parts: int = 1) -> dict[str, Any]:
    """Start one run per instance of this starter's share (every `parts`-th from `part`), as fast as the service allows."""
    h.django_setup()
    from instances.models import Instance
    from loops import services

    ids = json.loads(Path(instances_file).read_text())[part::parts]
    instances = Instance.objects.select_related("owner").in_bulk(ids)
    began = time.time()
    runs = [
        services.run_start(instance=instances[i], user=instances[i].owner, objective="count", via="api").pk
        for i in ids
    ]
    return {"runs": runs, "began": began, "ended": time.time()}


def queries(iterations: int, act: float, brain: str, home: str) -> dict[str, Any]:
    """Drive one run in-process and count the queries its iterations issue."""
    h.django_setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from instances.models import Instance
    from loops import leases, runner, services

    user = get_user_model().objects.get(username=USERNAME)
    instance = Instance.objects.create(
        owner=user,
        name="load-queries",
        brain=brain,
        command=command_agent(act) if brain == "command" else [],
        env={"GOAL": str(iterations), "ACT_SECONDS": str(act)},
        workspace=str(Path(home) / "workspaces" / "ws" / "queries"),
        max_iterations=iterations,
    )
    run = services.run_start(instance=instance, user=user, objective="count", via="api")
    with CaptureQueriesContext(connection) as captured:
        lease = leases.claim(run.pk, 1, "load-queries")
        assert lease is not None
        runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    statements = [q["sql"].split(None, 1)[0].upper() for q in captured.captured_queries]

    # CPU of one iteration in this process alone (no other thread, no capture): the floor.
    instance.max_iterations = 30
    instance.env = {"GOAL": "30", "ACT_SECONDS": "0"}
    instance.save()
    timed = services.run_start(instance=instance, user=user, objective="count", via="api")
    lease = leases.claim(timed.pk, 1, "load-cpu")
    assert lease is not None
    cpu, wall = time.process_time(), time.perf_counter()
    runner.drive(lease, slice_seconds=3600)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    timed.refresh_from_db()
    return {
        "cpu_ms": cpu / timed.iterations_done * 1000,
        "wall_ms": wall / timed.iterations_done * 1000,
        "iterations": run.iterations_done,
        "outcome": run.outcome,
        "queries": len(statements),
        "per_iteration": len(statements) / max(1, run.iterations_done),
        "by_kind": {kind: statements.count(kind) for kind in sorted(set(statements))},
        "brain_note": "act returns at once" if brain == "sleep" else "act: sh, sleep 0",
    }


def analyze(runs_file: str) -> dict[str, Any]:
    """Read back what happened: outcomes, iteration end times, event write times."""
    h.django_setup()
    from loops.models import Event, Iteration, Run

    ids = json.loads(Path(runs_file).read_text())
    runs = {r["id"]: r for r in Run.objects.filter(pk__in=ids).values("id", "status", "outcome", "last_seq")}
    iterations: dict[int, list[float]] = {}
    for run_id, finished in (
        Iteration.objects.filter(run_id__in=ids)
        .order_by("run_id", "number")
        .values_list("run_id", "finished_at")
    ):
        iterations.setdefault(run_id, []).append(finished.timestamp())
    written = {
        f"{run_id}:{seq}": created.timestamp()
        for run_id, seq, created in Event.objects.filter(run_id__in=ids).values_list(
            "run_id", "seq", "created_at"
        )
    }
    starts = {
        run_id: created.timestamp()
        for run_id, created in Event.objects.filter(
            run_id__in=ids, kind="run.claimed", seq__lte=3
        ).values_list("run_id", "created_at")
    }
    return {
        "runs": runs,
        "iterations": iterations,
        "written": written,
        "claimed": starts,
        "reaped": Event.objects.filter(run_id__in=ids, kind="run.reaped").count(),
        "claims": Event.objects.filter(run_id__in=ids, kind="run.claimed").count(),
    }


# --- a burst: every start and every viewer at the same instant ---------------------------------------------

OPEN_WITHIN = 10.0  # seconds a viewer's socket has to open
FIRST_WITHIN = 10.0  # ... and then to bring its first message


def start_burst(port: int, token: str, instance_ids: list[int], threads: int) -> list[dict[str, Any]]:
    """POST one start per instance from `threads` client threads released at the same instant."""
    shares = [instance_ids[i::threads] for i in range(threads)]
    answers: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client(share: list[int]) -> None:
        body = json.dumps({"objective": "count"})
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        gate.wait()
        for instance_id in share:
            began = time.monotonic()
            answer: dict[str, Any] = {"instance": instance_id}
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("POST", f"/v1/instances/{instance_id}/loop", body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                conn.close()
                answer["status"] = response.status
                said = json.loads(raw or b"{}")
                answer["run"] = said.get("id") if response.status == 201 else None
                answer["error"] = "" if response.status == 201 else start_error_class(response.status, said)
            except Exception as exc:  # a refused or dropped connection: its class is the finding
                answer["status"], answer["run"], answer["error"] = 0, None, type(exc).__name__
            answer["seconds"] = time.monotonic() - began
            with lock:
                answers.append(answer)

    workers = [threading.Thread(target=client, args=(share,)) for share in shares if share]
    gate = threading.Barrier(len(workers))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
    return answers


def start_error_class(status: int, said: dict[str, Any]) -> str:
    error = str(said.get("error", "")) if isinstance(said, dict) else ""
    if status == 503:
        return "503 busy" if "busy" in error else "503 outage" if "database" in error else "503"
    return f"{status}"


async def ws_open(port: int, path: str, cookie: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a websocket as a browser of http://127.0.0.1:port would; raise `Refused` unless it is accepted."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
            f"Cookie: {cookie}\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode(errors="replace")
    if status != "101":
        writer.close()
        raise Refused(f"HTTP {status}")
    return reader, writer


class Refused(Exception):
    pass


async def ws_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Read one whole message from the server (opcode, payload): a close is (8, its code and reason)."""
    opcode, payload = 0, b""
    while True:
        b0, b1 = await reader.readexactly(2)
        size = b1 & 0x7F
        if size == 126:
            size = int.from_bytes(await reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await reader.readexactly(8), "big")
        if b1 & 0x80:
            await reader.readexactly(4)  # a server never masks; tolerated
        chunk = await reader.readexactly(size)
        kind = b0 & 0x0F
        if kind >= 8:  # a control frame (close, ping, pong) stands alone
            if kind == 8:
                return 8, chunk
            continue
        opcode = opcode or kind
        payload += chunk
        if b0 & 0x80:
            return opcode, payload


async def burst_viewer(
    port: int, run_id: int, cookie: str, t0: float, until: float,
    open_within: float = OPEN_WITHIN, first_within: float = FIRST_WITHIN,
) -> dict[str, Any]:  # fmt: skip
    """One viewer of `run_id`, once: when it opened and got its first message (seconds after `t0`, monotonic),
    or why not (not open within `open_within`, no first message within `first_within` of its open); then it
    follows the run until it finishes or `until` (`until` in the past: it stops at its first message). In
    the shape `summarize` reads."""
    seen: dict[str, Any] = {
        "run_id": run_id, "seqs": [], "arrived": [], "opened_at": 0.0, "connects": 0, "closes": [],
        "duplicates": [], "gaps": [], "finished_seq": 0, "opened": None, "first": None, "error": "",
    }  # fmt: skip
    writer = None
    try:
        try:
            reader, writer = await asyncio.wait_for(
                ws_open(port, f"/ws/runs/{run_id}/?after=0", cookie), open_within
            )
        except TimeoutError:
            seen["error"] = f"not open within {open_within:g} s"
            return seen
        seen["opened"], seen["opened_at"], seen["connects"] = time.monotonic() - t0, time.time(), 1
        opened = time.monotonic()
        while seen["first"] is None or time.monotonic() < until:  # the first message has its own bound
            wait = (
                first_within - (time.monotonic() - opened)
                if seen["first"] is None
                else until - time.monotonic()
            )
            try:
                opcode, payload = await asyncio.wait_for(ws_message(reader), max(0.01, wait))
            except TimeoutError:
                if seen["first"] is None:
                    seen["error"] = f"no first message within {first_within:g} s"
                return seen
            if opcode == 8:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                seen["closes"].append(code)
                if seen["first"] is None or code != 1000:
                    seen["error"] = f"closed {code}" + (
                        " before the first message" if seen["first"] is None else ""
                    )
                return seen
            if seen["first"] is None:
                seen["first"] = time.monotonic() - t0
            match = h.EVENT_SEQ.match(payload[:160])
            if not match:
                continue
            seq, last = int(match.group(1)), (seen["seqs"][-1] if seen["seqs"] else 0)
            if seq <= last:
                seen["duplicates"].append(seq)
                continue
            if seq != last + 1:
                seen["gaps"].append((last, seq))
            seen["seqs"].append(seq)
            seen["arrived"].append(time.time())
            if h.FINISHED in payload[:1000]:
                seen["finished_seq"] = seq
                return seen
        return seen
    except Refused as exc:
        seen["error"] = str(exc)
        return seen
    except (OSError, asyncio.IncompleteReadError) as exc:
        seen["error"] = type(exc).__name__
        return seen
    finally:
        if writer is not None:
            writer.close()


async def viewer_burst(
    port: int, runs: list[int], cookie: str, seconds: float,
    open_within: float = OPEN_WITHIN, first_within: float = FIRST_WITHIN,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every viewer at the same instant (one herd); each follows its run for at most `seconds`."""
    t0 = time.monotonic()
    return list(
        await asyncio.gather(
            *(burst_viewer(port, run, cookie, t0, t0 + seconds, open_within, first_within) for run in runs)
        )
    )


def run_burst_viewers(spec_file: str, out_file: str) -> dict[str, Any]:
    spec = json.loads(Path(spec_file).read_text())
    seen = asyncio.run(viewer_burst(spec["ports"][0], spec["runs"], spec["cookie"], spec["seconds"]))
    Path(out_file).write_text(json.dumps(seen))
    return {"viewers": len(seen), "opened": sum(1 for v in seen if v["opened"] is not None)}


def burst_report(answers: list[dict[str, Any]], seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Refused starts and failed viewers, by class, with the starts' latency and the viewers' times."""
    refused: dict[str, int] = {}
    for answer in answers:
        if answer["status"] != 201:
            refused[answer["error"]] = refused.get(answer["error"], 0) + 1
    failed: dict[str, int] = {}
    for viewer in seen:
        if viewer["error"]:
            failed[viewer["error"]] = failed.get(viewer["error"], 0) + 1
    latencies = [a["seconds"] for a in answers]
    opened = [v["opened"] for v in seen if v["opened"] is not None]
    first = [v["first"] for v in seen if v["first"] is not None]
    return {
        "starts": len(answers),
        "started": sum(1 for a in answers if a["status"] == 201),
        "refused": refused,
        "start_s": {
            "p50": h.pct(latencies, 50),
            "p99": h.pct(latencies, 99),
            "max": max(latencies, default=0.0),
        },
        "viewers": len(seen),
        "opened": len(opened),
        "first_message": len(first),
        "opened_s": {"p50": h.pct(opened, 50), "p99": h.pct(opened, 99), "max": max(opened, default=0.0)},
        "first_s": {"p50": h.pct(first, 50), "p99": h.pct(first, 99), "max": max(first, default=0.0)},
        "failed": failed,
    }


class Sampler:
    """Peak connections to the server (all databases) and its max_connections, every 0.1 s in a thread."""

    def __init__(self) -> None:
        import psycopg

        self.conn = psycopg.connect(f"{h.PG_URL}/postgres?application_name=load-sampler", autocommit=True)
        row = self.conn.execute("SELECT current_setting('max_connections')::int").fetchone()
        self.max_connections = int(row[0]) if row else 0
        self.peak = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stopping.wait(0.1):
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            ).fetchone()
            self.peak = max(self.peak, int(row[0]) if row else 0)

    def stop(self) -> dict[str, int]:
        self.stopping.set()
        self.thread.join(5)
        self.conn.close()
        return {"peak": self.peak, "max_connections": self.max_connections}


# --- orchestration ----------------------------------------------------------------------------------------


class PgStats:
    """Whole-database counters and peak connections per application name (PostgreSQL only)."""

    def __init__(self, db: str) -> None:
        import psycopg

        self.db = db
        self.conn = psycopg.connect(f"{h.PG_URL}/postgres?application_name=load-harness", autocommit=True)
        self.runs = psycopg.connect(f"{h.PG_URL}/{db}?application_name=load-harness", autocommit=True)
        self.peak: dict[str, int] = {}
        self.peak_total = 0
        # What the database's active backends were doing, summed over samples.
        self.waits: dict[str, int] = {}
        self.samples = 0

    def counters(self) -> dict[str, int]:
        row = self.conn.execute(
            "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated, tup_deleted "
            "FROM pg_stat_database WHERE datname = %s",
            [self.db],
        ).fetchone()
        assert row is not None
        keys = ["commits", "rollbacks", "returned", "fetched", "inserted", "updated", "deleted"]
        return dict(zip(keys, (int(v) for v in row), strict=True))

    def sample_connections(self) -> None:
        rows = self.conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1", [self.db]
        ).fetchall()
        total = 0
        for name, count in rows:
            self.peak[name] = max(self.peak.get(name, 0), count)
            total += count
        self.peak_total = max(self.peak_total, total)
        self.samples += 1
        for kind, what, n in self.conn.execute(
            "SELECT CASE WHEN state = 'active' THEN coalesce(wait_event_type, 'CPU') ELSE 'Client' END, "
            "CASE WHEN state = 'active' THEN coalesce(wait_event, 'running') ELSE 'idle in transaction' END, "
            "count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND state IN ('active', 'idle in transaction') GROUP BY 1, 2",
            [self.db],
        ).fetchall():
            key = f"{kind}:{what}"
            self.waits[key] = self.waits.get(key, 0) + n

    def busy(self) -> dict[str, float]:
        """Mean number of active backends per state over the samples, most common first."""
        ranked = sorted(self.waits.items(), key=lambda kv: -kv[1])
        return {k: round(v / max(1, self.samples), 1) for k, v in ranked[:6]}

    def finished(self, ids: list[int]) -> int:
        row = self.runs.execute(
            "SELECT count(*) FROM loops_run WHERE status = 'finished' AND id = ANY(%s)", [ids]
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.conn.close()
        self.runs.close()


def measure(args: argparse.Namespace, backend: str, brain: str) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"tether-load-{backend}-{brain}-"))
    logs = home / "logs"
    logs.mkdir()
    redis = h.redis_url() if backend == "postgres" else None
    extra: dict[str, str] = {}
    if backend == "postgres":
        h.fresh_database(PG_DB)
        if redis:
            extra["REDIS_URL"] = redis
    else:
        extra["TETHER_SQLITE_PATH"] = str(home / "load.sqlite3")

    if args.db_pool is not None:
        extra["TETHER_DB_POOL"] = str(args.db_pool)

    def env(app: str, **more: str) -> dict[str, str]:
        e = h.base_env(home, **extra, **more)
        if backend == "postgres":
            e["DATABASE_URL"] = h.database_url(PG_DB, app)
        return e

    procs: list[h.Proc] = []
    helpers: list[h.Proc] = []  # not Tether: the viewers
    result: dict[str, Any] = {"backend": backend + (" + Redis" if redis else ""), "brain": brain}
    pg: PgStats | None = None
    watch: h.MemoryWatch | None = None
    sampler: Sampler | None = None
    try:
        made = h.role(
            "bench.load", env("load-prepare"), "prepare", str(args.runs), str(args.iterations), str(args.act),
            brain, str(home),
        )  # fmt: skip
        (home / "instances.json").write_text(json.dumps(made["instances"]))
        ports = [h.free_port() for _ in range(args.web)]
        for i, port in enumerate(ports):
            if args.burst:  # as deployed: `serve --web-only` (its budget, its listen backlog)
                procs.append(h.serve_web(f"web{i}", port, env("tether-web"), logs))
            else:
                procs.append(h.daphne(f"web{i}", port, env("tether-web"), logs))
        knobs = {"TETHER_WORKERS": str(args.workers)}
        if args.connections_per_worker is not None:
            knobs["TETHER_CONNECTIONS_PER_WORKER"] = str(args.connections_per_worker)
        workers = env("tether-worker", **knobs)
        for c in range(args.clusters):  # two clusters stand for two machines sharing the database
            procs.append(h.qcluster(f"cluster{c}", workers, logs))
        for port in ports:
            h.wait_http_ok(port, "/healthz", 60)
        h.wait_http_ok(ports[0], "/readyz", 60)
        watch = h.MemoryWatch(lambda: [p.pid for p in procs])
        # What the idle cluster costs (queue polling, heartbeats): measured, then set apart.
        watch.sample()
        idle_from, idle_cpu = time.monotonic(), dict(watch.cpu_by_root())
        time.sleep(3)
        watch.sample()
        cpu_before = dict(watch.cpu_by_root())
        idle_rate = sum(
            cpu_before.get(p.pid, 0) - idle_cpu.get(p.pid, 0) for p in procs if "cluster" in p.name
        ) / (time.monotonic() - idle_from)
        busy_from = time.monotonic()
        machine_before, pg_cpu_before = h.machine_cpu_seconds(), h.postgres_cpu_seconds()
        load_before = os.getloadavg()[0]
        watch.start()
        if backend == "postgres":
            pg = PgStats(PG_DB)
            before = pg.counters()

        sampler = Sampler() if args.burst and backend == "postgres" else None
        answers: list[dict[str, Any]] = []
        if args.burst:  # every start at the same instant, through the API, from many client threads
            began = time.time()
            answers = start_burst(ports[0], made["token"], made["instances"], args.start_threads)
            started = {"runs": [a["run"] for a in answers if a["run"]], "began": began, "ended": time.time()}
        else:
            # A fleet is started by many clients at once: the starters share the runs out.
            with ThreadPoolExecutor(args.starters) as pool:
                shares = list(
                    pool.map(
                        lambda part: h.role(
                            "bench.load",
                            env("load-start"),
                            "start",
                            str(home / "instances.json"),
                            str(part),
                            str(args.starters),
                        ),
                        range(args.starters),
                    )
                )
            started = {
                "runs": [run for share in shares for run in share["runs"]],
                "began": min(share["began"] for share in shares),
                "ended": max(share["ended"] for share in shares),
            }
        run_ids: list[int] = started["runs"]
        (home / "runs.json").write_text(json.dumps(run_ids))
        spec = {
            "runs": [run_ids[i % len(run_ids)] for i in range(args.viewers)],
            "ports": ports,
            "cookie": made["cookie"],
            "seconds": args.iterations * args.act * 8 + 90,
        }
        (home / "viewers.json").write_text(json.dumps(spec))
        viewer_proc = None
        if args.viewers and run_ids:
            viewer_proc = h.Proc(
                "viewers",
                [sys.executable, "-m", "bench.load", "--role", "burst_viewers" if args.burst else "viewers",
                 str(home / "viewers.json"), str(home / "seen.json")],
                env("load-viewers"),
                logs,
            )  # fmt: skip
            helpers.append(viewer_proc)
        if sampler is not None:  # through both bursts: until every viewer opened or gave up
            time.sleep(OPEN_WITHIN + FIRST_WITHIN if args.viewers else 0)
            result["pg_burst_connections"] = sampler.stop()
            sampler = None

        deadline = time.monotonic() + args.iterations * args.act * 8 + 60
        done = 0
        while time.monotonic() < deadline:
            if pg is not None:
                pg.sample_connections()
                done = pg.finished(run_ids)
            else:
                done = sqlite_finished(home / "load.sqlite3", run_ids)
            if done == len(run_ids):
                break
            if not all(p.alive() for p in procs):
                dead = [p for p in procs if not p.alive()]
                raise SystemExit(f"{dead[0].name} exited:\n{dead[0].tail()}")
            time.sleep(0.5)
        result["finished_runs"] = done
        if pg is not None:
            after = pg.counters()
            result["pg"] = {k: after[k] - before[k] for k in after}
            result["pg_peak_connections"] = dict(pg.peak, total=pg.peak_total)
            result["pg_active"] = pg.busy()
        watch.stop()
        watch.sample()
        machine_after, pg_cpu_after = h.machine_cpu_seconds(), h.postgres_cpu_seconds()
        cpu_after = watch.cpu_by_root()
        result["cpu"] = {
            "workers_s": sum(
                cpu_after.get(p.pid, 0) - cpu_before.get(p.pid, 0) for p in procs if "cluster" in p.name
            ),
            "workers_idle_s": idle_rate * (time.monotonic() - busy_from),
            "web_s": sum(
                cpu_after.get(p.pid, 0) - cpu_before.get(p.pid, 0) for p in procs if "web" in p.name
            ),
            "postgres_s": pg_cpu_after - pg_cpu_before,
            "machine_busy_s": machine_after[0] - machine_before[0],
            "machine_total_s": machine_after[1] - machine_before[1],
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
        }
        if viewer_proc is not None:
            try:
                viewer_proc.proc.wait(timeout=30)
            except Exception:
                viewer_proc.signal_group(signal.SIGTERM)
                viewer_proc.proc.wait(timeout=30)
            seen = h.read_json(home / "seen.json") if (home / "seen.json").exists() else []
        else:
            seen = []
        for proc in procs:
            proc.stop()
        facts = h.role("bench.load", env("load-analyze"), "analyze", str(home / "runs.json"))
        counted = h.role(
            "bench.load", env("load-queries"), "queries", str(min(args.iterations, 3)), "0.05", brain,
            str(home),
        )  # fmt: skip
        result.update(summarize(args, facts, seen, started))
        if args.burst:
            result["burst"] = burst_report(answers, seen)
        result["queries"] = counted
        result["memory"] = {
            "tether_mib": watch.peak.tether_kib / 1024,
            "tether_processes": watch.peak.tether_processes,
            "agents_mib": watch.peak.agents_kib / 1024,
            "agent_processes": watch.peak.agent_processes,
        }
        result["logs"] = {p.name: errors_in(p.tail(200_000)) for p in procs}
    finally:
        if sampler is not None:
            sampler.stop()
        if watch is not None:
            watch.stop()
        for proc in procs + helpers:
            proc.stop()
        if pg is not None:
            pg.close()
        if not args.keep:
            if backend == "postgres":
                h.drop_database(PG_DB)
            shutil.rmtree(home, ignore_errors=True)
    return result


def errors_in(log: str) -> dict[str, int]:
    lines = log.splitlines()
    return {
        "tracebacks": sum(1 for line in lines if line.startswith("Traceback")),
        "errors": sum(1 for line in lines if " ERROR " in line or "CRITICAL" in line),
        "driver_failed": sum(1 for line in lines if "driver failed" in line),
        "too_many_clients": sum(1 for line in lines if "too many clients" in line),
    }


def summarize(
    args: argparse.Namespace, facts: dict[str, Any], seen: list[dict], started: dict
) -> dict[str, Any]:
    runs = facts["runs"]
    iterations = {int(k): v for k, v in facts["iterations"].items()}
    ends = sorted(t for times in iterations.values() for t in times)
    total = len(ends)
    ideal = args.runs / args.act
    claimed = [float(t) for t in facts["claimed"].values()]
    # Steady window: from the moment every run has finished its first iteration to the
    # moment the first run finishes its last one (every run live throughout).
    firsts = [times[0] for times in iterations.values() if times]
    lasts = [times[-1] for times in iterations.values() if times]
    steady: dict[str, float] = {}
    if firsts and lasts and max(firsts) < min(lasts):
        lo, hi = max(firsts), min(lasts)
        inside = sum(1 for t in ends if lo < t <= hi)
        steady = {"seconds": hi - lo, "rate": inside / (hi - lo)}
    cycles = [b - a for times in iterations.values() for a, b in zip(times, times[1:], strict=False)]
    whole_seconds = (max(ends) - min(claimed)) if ends and claimed else float("nan")
    outcomes: dict[str, int] = {}
    for run in runs.values():
        outcomes[run["outcome"] or run["status"]] = outcomes.get(run["outcome"] or run["status"], 0) + 1

    latencies: list[float] = []
    problems = {"duplicates": 0, "gaps": 0, "incomplete": 0}
    written = facts["written"]
    for log in seen:
        problems["duplicates"] += len(log["duplicates"])
        problems["gaps"] += len(log["gaps"])
        last_seq = runs.get(str(log["run_id"]), {}).get("last_seq")
        if last_seq is None or log["seqs"] != list(range(1, last_seq + 1)):
            problems["incomplete"] += 1
        live_from = log["opened_at"] + 0.5
        for seq, at in zip(log["seqs"], log["arrived"], strict=True):
            at_written = written.get(f"{log['run_id']}:{seq}")
            if at_written is not None and at_written >= live_from:
                latencies.append((at - at_written) * 1000)
    return {
        "runs": len(runs),
        "outcomes": outcomes,
        "iterations": total,
        "ideal_rate": ideal,
        "steady": steady,
        "cycle_mean_s": statistics.fmean(cycles) if cycles else float("nan"),
        "cycle_p95_s": h.pct(cycles, 95),
        "per_run_rate": args.runs / statistics.fmean(cycles) if cycles else float("nan"),
        "whole_seconds": whole_seconds,
        "whole_rate": total / whole_seconds if ends else float("nan"),
        "ideal_whole_seconds": args.iterations * args.act,
        "start_seconds": started["ended"] - started["began"],
        "pickup_spread_s": (max(claimed) - min(claimed)) if claimed else float("nan"),
        "reaped": facts["reaped"],
        "claims": facts["claims"],
        "latency_ms": {
            "count": len(latencies),
            "p50": h.pct(latencies, 50),
            "p95": h.pct(latencies, 95),
            "p99": h.pct(latencies, 99),
            "max": max(latencies) if latencies else float("nan"),
        },
        "viewers": {
            "count": len(seen),
            "connected": sum(1 for v in seen if v["connects"]),
            **problems,
            "reconnects": sum(max(0, v["connects"] - 1) for v in seen),
            "refused": sum(sum(1 for code in v["closes"] if code != 1000) for v in seen),
        },
    }


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    print(
        f"\nLoad: {args.runs} runs × {args.iterations} iterations, acts of {args.act:g} s, "
        f"{args.viewers} websocket viewers, {args.clusters} cluster(s) × {args.workers} worker process(es), {args.web} web process(es)"
    )
    for r in results:
        ideal = r["ideal_rate"]
        print(f"\n== {r['backend']}, brain {r['brain']}")
        print(f"  runs finished            {r['finished_runs']}/{r['runs']}  outcomes {r['outcomes']}")
        if r["steady"]:
            s = r["steady"]
            print(
                f"  rate, all runs live      {s['rate']:.1f} it/s of ideal {ideal:.1f} = {s['rate'] / ideal:.0%}"
                f"  (window {s['seconds']:.1f} s)"
            )
        print(
            f"  rate, per run            {r['per_run_rate']:.1f} it/s = {r['per_run_rate'] / ideal:.0%}"
            f"  (iteration every {r['cycle_mean_s']:.3f} s mean, {r['cycle_p95_s']:.3f} s p95; ideal {args.act:g})"
        )
        print(
            f"  rate, whole run          {r['whole_rate']:.1f} it/s = {r['whole_rate'] / ideal:.0%}"
            f"  ({r['iterations']} iterations in {r['whole_seconds']:.1f} s; ideal {r['ideal_whole_seconds']:g} s;"
            f" runs created in {r['start_seconds']:.1f} s, first claims spread over {r['pickup_spread_s']:.1f} s)"
        )
        lat = r["latency_ms"]
        v = r["viewers"]
        print(
            f"  event latency            p50 {lat['p50']:.0f} ms, p95 {lat['p95']:.0f} ms, p99 {lat['p99']:.0f} ms,"
            f" max {lat['max']:.0f} ms ({lat['count']} live deliveries to {v['count']} viewers)"
        )
        print(
            f"  viewers                  {v['connected']} of {v['count']} ever connected (handshake within 10 s);"
            f" {v['refused']} sockets failed or dropped; duplicates {v['duplicates']}, gaps {v['gaps']},"
            f" incomplete {v['incomplete']}, reconnects {v['reconnects']}"
        )
        m = r["memory"]
        print(
            f"  peak RSS, Tether         {m['tether_mib']:.0f} MiB in {m['tether_processes']} processes"
            f"  (agents' processes: {m['agents_mib']:.0f} MiB in {m['agent_processes']})"
        )
        q = r["queries"]
        print(f"  queries per iteration    {q['per_iteration']:.1f} in the runner  {q['by_kind']}")
        print(
            f"  one iteration alone      {q['cpu_ms']:.1f} ms CPU in the driving process, {q['wall_ms']:.1f} ms wall"
            f" ({q['brain_note']})"
        )
        if "pg" in r:
            pg = r["pg"]
            n = max(1, r["iterations"])
            print(
                f"  whole system, per iter.  {pg['commits'] / n:.1f} commits, {pg['rollbacks'] / n:.2f} rollbacks,"
                f" {pg['inserted'] / n:.1f} rows inserted, {pg['updated'] / n:.1f} updated"
                f" (workers + broker + viewers)"
            )
            print(f"  peak connections         {r['pg_peak_connections']}")
            print(f"  busy backends (mean)     {r['pg_active']}")
        c = r["cpu"]
        n = max(1, r["iterations"])
        print(
            f"  CPU per iteration        workers {c['workers_s'] / n * 1000:.1f} ms"
            f" ({(c['workers_s'] - c['workers_idle_s']) / n * 1000:.1f} ms beyond the idle cluster's),"
            f" web {c['web_s'] / n * 1000:.1f} ms,"
            f" PostgreSQL {c['postgres_s'] / n * 1000:.1f} ms (all databases);"
            f" machine {c['machine_busy_s'] / max(1e-9, c['machine_total_s']):.0%} busy,"
            f" load average {c['load_before']:.1f} -> {c['load_after']:.1f}"
        )
        print(f"  reaper                   {r['reaped']} run(s) re-scheduled; {r['claims']} claims")
        if "burst" in r:
            b = r["burst"]
            print(
                f"  burst: starts            {b['started']}/{b['starts']} started, refused {b['refused'] or 0}"
                f" (from {args.start_threads} threads at once; latency p50 {b['start_s']['p50']:.2f} s,"
                f" p99 {b['start_s']['p99']:.2f} s, max {b['start_s']['max']:.2f} s)"
            )
            print(
                f"  burst: viewers           {b['opened']}/{b['viewers']} opened within {OPEN_WITHIN:g} s"
                f" (p99 {b['opened_s']['p99']:.2f} s, max {b['opened_s']['max']:.2f} s), {b['first_message']}/{b['viewers']}"
                f" got their first message (p99 {b['first_s']['p99']:.2f} s, max {b['first_s']['max']:.2f} s);"
                f" failed: {b['failed'] or 0}"
            )
            if "pg_burst_connections" in r:
                c = r["pg_burst_connections"]
                print(
                    f"  burst: connections       peak {c['peak']} of max_connections {c['max_connections']} (whole server)"
                )
        print(f"  logs                     {r['logs']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--act", type=float, default=2.0)
    parser.add_argument("--viewers", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2, help="worker processes in the cluster")
    parser.add_argument(
        "--clusters", type=int, default=1, help="worker clusters (each one stands for a machine of its own)"
    )
    parser.add_argument("--web", type=int, default=1, help="web processes (viewers spread over them)")
    parser.add_argument("--starters", type=int, default=4, help="processes that start the runs, side by side")
    parser.add_argument(
        "--connections-per-worker",
        type=int,
        default=None,
        help="TETHER_CONNECTIONS_PER_WORKER: runs per worker process that keep their connection",
    )
    parser.add_argument(
        "--db-pool",
        type=int,
        default=None,
        help="TETHER_DB_POOL: PostgreSQL connections each worker process pools (0: no pool; default: the setting's, 32)",
    )
    parser.add_argument("--brain", default="command", help="command, sleep or both (comma-separated)")
    parser.add_argument("--backend", default="postgres", help="postgres, sqlite or both (comma-separated)")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="every start (API requests) and then every viewer at the same instant, once each; report what was refused",
    )
    parser.add_argument("--start-threads", type=int, default=64, help="client threads of --burst's starts")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway database and the logs")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    for flag in ("runs", "iterations", "workers", "clusters", "web", "starters", "start_threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be 1 or more, got {getattr(args, flag)}")
    if args.db_pool is not None and args.db_pool < 0:
        parser.error(f"--db-pool must be 0 (no pool) or more, got {args.db_pool}")
    if args.viewers < 0 or args.act <= 0:
        parser.error("--viewers must be 0 or more and --act a positive number of seconds")
    backends = [b for b in args.backend.split(",") if b]
    if "postgres" in backends and not h.pg_available():
        raise SystemExit("PostgreSQL does not answer on 127.0.0.1:5432 (use --backend sqlite)")
    results = [
        measure(args, backend, brain) for backend in backends for brain in args.brain.split(",") if brain
    ]
    report(args, results)
    if args.json:
        print(json.dumps(results, default=str))


def sqlite_finished(path: Path, ids: list[int]) -> int:
    """Count the finished runs straight from the SQLite file (read-only; WAL lets it read alongside)."""
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        marks = ",".join("?" * len(ids))
        row = db.execute(f"SELECT count(*) FROM loops_run WHERE status = 'finished' AND id IN ({marks})", ids)
        return int(row.fetchone()[0])


ROLES = {
    "prepare": lambda a: prepare(int(a[0]), int(a[1]), float(a[2]), a[3], a[4]),
    "start": lambda a: start(a[0], int(a[1]), int(a[2])),
    "viewers": lambda a: h.run_viewers(a[0], a[1]),
    "burst_viewers": lambda a: run_burst_viewers(a[0], a[1]),
    "queries": lambda a: queries(int(a[0]), float(a[1]), a[2], a[3]),
    "analyze": lambda a: analyze(a[0]),
}

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--role":
        print(json.dumps(ROLES[sys.argv[2]](sys.argv[3:])))
    else:
        os.environ.pop("DJANGO_SETTINGS_MODULE", None)
        main()
