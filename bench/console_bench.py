"""The live console's figures: event latency to a websocket viewer, replay, and the run page's server time.

Not a test. For each shape, in a throwaway database, with a real daphne serving tether.asgi:
- event latency: a separate writer process appends events to a run, one at a time (20-100 ms
  apart), and notes when each commit returned; a websocket client following the run notes when
  each event's message arrived. Latency is the difference (same machine, same clock), p50/p95/max.
  Embedded default: SQLite, the consumer tails the events table (every 0.25 s).
  Scale-out: PostgreSQL (when 127.0.0.1:5432 answers, else SQLite) + Redis: the doorbell wakes it.
- replay: a client connecting with ?after=0 to a run with 10,000 events, until the last arrives.
- run page: GET /runs/<id>/ of that run (10,000 events, ~1,430 iterations) in-process, server time
  p50/p95, its size and query count.

Run: python -m bench.console_bench
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench._harness import drop_database, fresh_database, pg_available

ROOT = Path(__file__).resolve().parent.parent
PG_DB = "tether_bench_console"
REDIS_DEFAULT = "redis://127.0.0.1:6379/0"
LATENCY_EVENTS = 150
BIG_EVENTS = 10_000
PAGE_REQUESTS = 15
SEQ = re.compile(rb'data-seq="(\d+)"')


# --- roles run in subprocesses, each with its shape's environment ------------------------------------


def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tether.settings")
    import django

    django.setup()


def prepare() -> dict:
    """Migrate, make a user, an instance, a small run and a 10,000-event run; return ids and a session cookie."""
    _django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import transaction
    from django.test import Client
    from django.utils import timezone

    from instances.models import Instance
    from loops import events, services
    from loops.models import Iteration

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user("bench", password="bench-pw-1")
    instance = Instance.objects.create(owner=user, name="bench", command=["true"], max_iterations=10_000)
    small = services.run_start(instance=instance, user=user, objective="latency", via="cli")
    big = services.run_start(instance=instance, user=user, objective="a long story", via="cli")
    story = [
        ("run.claimed", {"iteration": 0, "worker": "bench", "attempt": 1}),
        (
            "iteration.started",
            {"iteration": 0, "instruction": "carry on with the objective " * 8, "interjections": 0},
        ),
        ("act.started", {"iteration": 0}),
        (
            "act.finished",
            {
                "iteration": 0,
                "ok": True,
                "detail": "",
                "response": "did a piece of the work\n" * 20,
                "tool_calls": [
                    {"name": "write_file", "input": {"path": "a.txt"}, "is_error": False, "result": "ok"}
                ],
                "usage": {"input_tokens": 1200, "output_tokens": 300},
            },
        ),
        (
            "checks.finished",
            {
                "iteration": 0,
                "checks": [{"name": "tests", "required": True, "passed": False, "output": "1 failed\n" * 5}],
            },
        ),
        ("decision.made", {"iteration": 0, "verdict": "continue", "reason": "a test fails"}),
        ("iteration.finished", {"iteration": 0, "cost_usd": "0.001200", "duration_ms": 1500, "act_ok": True}),
    ]
    now = timezone.now()
    number, written = 0, 1  # run.started is seq 1
    while written < BIG_EVENTS:
        number += 1
        items = [(kind, {**data, "iteration": number}) for kind, data in story][: BIG_EVENTS - written]
        with transaction.atomic():
            events.append_many(big.pk, items)
        written += len(items)
    Iteration.objects.bulk_create(
        Iteration(
            run=big,
            number=n,
            instruction="carry on",
            response="did a piece",
            act_ok=True,
            checks=[{"name": "tests", "required": True, "passed": n % 3 == 0, "output": ""}],
            decision={"verdict": "continue", "reason": "a test fails"},
            cost_micros=1000 + n,
            started_at=now,
            finished_at=now,
        )
        for n in range(1, number)
    )
    big.refresh_from_db()
    small.refresh_from_db()
    client = Client()
    client.force_login(user)
    return {
        "small": small.pk,
        "small_last_seq": small.last_seq,
        "big": big.pk,
        "big_last_seq": big.last_seq,
        "cookie": f"sessionid={client.cookies['sessionid'].value}",
    }


def writer(run_id: int, count: int) -> None:
    """Append `count` events to run `run_id`, one per transaction; print each seq and its commit time."""
    _django()
    from django.db import transaction

    from loops import events

    rng = random.Random(7)
    for i in range(count):
        with transaction.atomic():
            seq = events.append(run_id, "interjection.queued", {"id": i, "text": f"tick {i}", "by": "bench"})
        print(f"{seq} {time.time():.6f}", flush=True)
        time.sleep(rng.uniform(0.02, 0.1))


def page_time(run_id: int) -> dict:
    """Time GET /runs/<id>/ in-process (no network): server time only."""
    _django()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    url = f"/runs/{run_id}/"
    client.get(url)  # warm templates and connections
    times = []
    for _ in range(PAGE_REQUESTS):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    return {
        "p50_ms": statistics.median(times),
        "p95_ms": _pct(times, 95),
        "kb": len(response.content) / 1024,
        "queries": len(queries.captured_queries),
        "events_shown": len(SEQ.findall(response.content)),
    }


# --- the websocket client ---------------------------------------------------------------------------------


async def follow(
    port: int, path: str, cookie: str, until_seq: int, timeout: float, started: asyncio.Event | None = None
):
    """Follow a run's socket until seq `until_seq` arrives; return {seq: arrival time}."""
    from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol

    arrived: dict[int, float] = {}
    done = asyncio.get_running_loop().create_future()

    class Viewer(WebSocketClientProtocol):
        def onOpen(self):  # noqa: N802 (autobahn's names)
            if started is not None:
                started.set()

        def onMessage(self, payload, isBinary):  # noqa: N802, N803
            at = time.time()
            match = SEQ.search(payload[:200])
            if match:
                seq = int(match.group(1))
                arrived.setdefault(seq, at)
                if seq >= until_seq and not done.done():
                    done.set_result(True)

        def onClose(self, wasClean, code, reason):  # noqa: N802, N803
            if not done.done():
                done.set_exception(RuntimeError(f"socket closed: {code} {reason}"))

    url = f"ws://127.0.0.1:{port}{path}"
    factory = WebSocketClientFactory(url, origin=f"http://127.0.0.1:{port}", headers={"Cookie": cookie})
    factory.protocol = Viewer
    transport, protocol = await asyncio.get_running_loop().create_connection(factory, "127.0.0.1", port)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        protocol.sendClose()
        await asyncio.sleep(0.05)
        transport.close()
    return arrived


# --- the orchestration ------------------------------------------------------------------------------------


def _pct(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _role(env: dict, *args: str, capture: bool = True) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "bench.console_bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=capture,
        text=True,
    )
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"console bench role {args[0]} failed")
    return out.stdout


def _redis_url() -> str | None:
    url = os.environ.get("REDIS_URL") or REDIS_DEFAULT
    try:
        import redis

        redis.Redis.from_url(url, socket_timeout=1).ping()
    except Exception:
        return None
    return url


def _daphne(env: dict, home: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    log = open(home / "daphne.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tether.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    ends = time.monotonic() + 30
    while time.monotonic() < ends:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"daphne did not start: {(home / 'daphne.log').read_text()[-2000:]}")


def measure(shape: str, env: dict, home: Path, with_page: bool) -> dict:
    made = json.loads(_role(env, "--prepare").strip().splitlines()[-1])
    proc, port = _daphne(env, home)
    try:
        first = made["small_last_seq"]
        last = first + LATENCY_EVENTS

        async def latency():
            opened = asyncio.Event()
            viewer = asyncio.create_task(
                follow(port, f"/ws/runs/{made['small']}/?after={first}", made["cookie"], last, 120, opened)
            )
            await asyncio.wait_for(opened.wait(), 10)
            await asyncio.sleep(0.5)
            written = await asyncio.to_thread(_role, env, "--writer", str(made["small"]), str(LATENCY_EVENTS))
            arrived = await viewer
            return written, arrived

        written, arrived = asyncio.run(latency())
        committed = {int(seq): float(t) for seq, t in (line.split() for line in written.strip().splitlines())}
        delays = [(arrived[seq] - t) * 1000 for seq, t in committed.items() if seq in arrived]
        missing = sorted(set(committed) - set(arrived))
        result = {
            "latency_p50_ms": statistics.median(delays),
            "latency_p95_ms": _pct(delays, 95),
            "latency_max_ms": max(delays),
            "missing": len(missing),
        }
        started = time.monotonic()
        replayed = asyncio.run(
            follow(port, f"/ws/runs/{made['big']}/?after=0", made["cookie"], made["big_last_seq"], 300)
        )
        result["replay_s"] = time.monotonic() - started
        result["replay_events"] = len(replayed)
        if with_page:
            result["page"] = json.loads(_role(env, "--page", str(made["big"])).strip().splitlines()[-1])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    result["shape"] = shape
    return result


def main() -> None:
    results = []
    base = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "TETHER_SQLITE_PATH")
    }
    base["TETHER_LOG_LEVEL"] = "WARNING"
    with tempfile.TemporaryDirectory(prefix="tether-console-bench-") as tmp:
        home = Path(tmp) / "embedded"
        home.mkdir()
        env = {**base, "TETHER_HOME": str(home), "TETHER_SQLITE_PATH": str(home / "bench.sqlite3")}
        results.append(measure("embedded: SQLite, tailing", env, home, with_page=True))

        redis_url = _redis_url()
        if redis_url is None:
            print("(no Redis at REDIS_URL or 127.0.0.1:6379: the scale-out shape is skipped)")
        else:
            home = Path(tmp) / "scaleout"
            home.mkdir()
            env = {**base, "TETHER_HOME": str(home), "REDIS_URL": redis_url}
            use_pg = pg_available()
            if use_pg:
                fresh_database(PG_DB)
                env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{PG_DB}"
            else:
                env["TETHER_SQLITE_PATH"] = str(home / "bench.sqlite3")
            try:
                shape = ("PostgreSQL" if use_pg else "SQLite") + " + Redis doorbell"
                results.append(measure(shape, env, home, with_page=use_pg))
            finally:
                if use_pg:
                    drop_database(PG_DB)

    print(
        f"\nConsole: event latency, writer process -> websocket viewer ({LATENCY_EVENTS} events, 20-100 ms apart)"
    )
    print(f"{'shape':40}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}{'missing':>9}")
    for r in results:
        print(
            f"{r['shape']:40}{r['latency_p50_ms']:>10.1f}{r['latency_p95_ms']:>10.1f}"
            f"{r['latency_max_ms']:>10.1f}{r['missing']:>9}"
        )
    print(f"\nReplay of a {BIG_EVENTS:,}-event run to a viewer connecting with ?after=0")
    for r in results:
        print(f"{r['shape']:40}{r['replay_s']:>8.2f} s  ({r['replay_events']:,} events)")
    print(
        f"\nRun page with {BIG_EVENTS:,} events recorded: server time of GET /runs/<id>/ ({PAGE_REQUESTS} requests)"
    )
    for r in results:
        if "page" in r:
            p = r["page"]
            print(
                f"{r['shape']:40}p50 {p['p50_ms']:.1f} ms, p95 {p['p95_ms']:.1f} ms; {p['kb']:.0f} KB, "
                f"{p['queries']} queries, the latest {p['events_shown']} events drawn"
            )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--prepare":
        print(json.dumps(prepare()))
    elif len(sys.argv) == 4 and sys.argv[1] == "--writer":
        writer(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--page":
        print(json.dumps(page_time(int(sys.argv[2]))))
    else:
        main()
