"""A herd of sockets (every tab reconnecting in the same second after a restart) shares its work and
all of it gets in: one session check per person, one replay read per run, and 500 handshakes at once
to a real server all open and receive their first message, none closed 1011 (how fast they do is
measured by `make load LOAD_ARGS=--burst`, not here)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore

from tests.console.test_consumers import receive_events, session_cookie
from tests.console.test_consumers import socket as ws_socket
from tests.support.cluster import worker_env

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(settings.BASE_DIR)
HERD = 500


def test_a_herd_of_one_persons_sockets_costs_one_session_check_and_one_replay_read(user, run, monkeypatch):
    from loops import selectors

    cookie = session_cookie(user)
    loads, replays = [], []
    real_load, real_events_between = SessionStore.load, selectors.events_between

    def counted_load(self):  # Django's own session read, counted
        loads.append(self.session_key)
        return real_load(self)

    def counted_events_between(spans):  # a read of runs' events (a replay's), counted per run
        replays.extend((run_id, after) for run_id, (after, _) in spans.items())
        return real_events_between(spans)

    monkeypatch.setattr(SessionStore, "load", counted_load)
    monkeypatch.setattr(selectors, "events_between", counted_events_between)

    async def go():
        sockets = [ws_socket(f"/ws/runs/{run.pk}/?after=0", cookie) for _ in range(50)]
        opened = await asyncio.gather(*(ws.connect(timeout=20) for ws in sockets))
        replayed = await asyncio.gather(*(receive_events(ws, run.last_seq, timeout=20) for ws in sockets))
        for ws in sockets:
            await ws.disconnect()
        return [ok for ok, _ in opened], replayed

    opened, replayed = asyncio.run(go())
    assert all(opened)
    assert all(len(events) == run.last_seq for events, _ in replayed)  # every socket got the whole replay
    # Fifty sockets of one sign-in on one run: without sharing, 50 session reads and 50 replay reads.
    assert len(loads) <= 3, len(loads)
    assert len([r for r in replays if r == (run.pk, 0)]) <= 3, replays


def test_a_herd_shares_only_a_read_in_flight_and_its_error_and_outlives_a_socket_that_leaves():
    """Single flight, no memory: sockets asking while a read runs share it (its answer or its error);
    once it is done, the next socket reads afresh; a socket that closes while it waits leaves the read
    to the others."""
    from web.consumers import Herd

    async def go():
        herd, asked, release = Herd(), [], asyncio.Event()

        async def read():
            asked.append(1)
            await release.wait()
            if len(asked) == 3:
                raise RuntimeError("the database said no")
            return len(asked)

        first = asyncio.create_task(herd.share("k", read))
        second = asyncio.create_task(herd.share("k", read))
        await asyncio.sleep(0)
        first.cancel()  # its socket closed while it waited
        await asyncio.sleep(0)
        release.set()
        shared = await second
        after = await herd.share("k", read)  # done: read again, nothing kept
        release.clear()
        failing = [asyncio.create_task(herd.share("k", read)) for _ in range(2)]
        await asyncio.sleep(0)
        release.set()
        errors = await asyncio.gather(*failing, return_exceptions=True)
        again = await herd.share("k", read)  # an error is not kept either
        return first.cancelled(), shared, after, errors, again, len(asked)

    cancelled, shared, after, errors, again, reads = asyncio.run(go())
    assert cancelled and shared == 1 and after == 2
    assert [str(e) for e in errors] == ["the database said no"] * 2
    assert again == 4 and reads == 4


# --- a real server, a real herd ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`manage.py serve` (as deployed: its connection budget, its listen backlog) on the test database."""

    def __init__(self, log_dir: Path, *roles: str, **env: str) -> None:
        self.port = free_port()
        self.log_path = log_dir / "serve.log"
        self.log = open(self.log_path, "wb")
        argv = [
            sys.executable,
            str(ROOT / "manage.py"),
            "serve",
            "--no-migrate",
            *roles,
            "--port",
            str(self.port),
        ]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=worker_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"serve did not answer within {timeout} s: {self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # serve alone: it stops its children in order
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of its group
        except ProcessLookupError:
            pass
        self.log.close()


@pytest.mark.slow
@pytest.mark.alone  # a herd takes the machine: beside other tests, it measures them, not the server
def test_five_hundred_handshakes_at_once_all_open_and_get_their_replay(user, run, tmp_path):
    """Behaviour, not speed: every socket of the herd opens and gets its replay's first event, none is
    closed 1011. Each waits for its open and then its first message, each bounded by a minute so a
    loaded machine passes, and stops there; how fast they come is `make load LOAD_ARGS=--burst`'s."""
    from bench.load import viewer_burst

    cookie = session_cookie(user).decode()
    server = Serve(tmp_path, "--web-only")
    try:
        seen = asyncio.run(
            viewer_burst(server.port, [run.pk] * HERD, cookie, 0, open_within=60, first_within=60)
        )
    finally:
        server.stop()
    failed: dict[str, int] = {}
    for viewer in seen:
        if viewer["error"]:
            failed[viewer["error"]] = failed.get(viewer["error"], 0) + 1
    opened = [v["opened"] for v in seen if v["opened"] is not None]
    first = [v for v in seen if v["first"] is not None]
    slowest_first = max((v["first"] for v in first), default=0)
    print(f"herd of {HERD}: {len(opened)} opened (slowest {max(opened, default=0):.2f} s), {len(first)} got their"
          f" first message (slowest {slowest_first:.2f} s after the start); failed {failed}")  # fmt: skip
    said = f"failed {failed}; log: {server.tail(1500)}"
    assert not any(1011 in v["closes"] for v in seen), said
    assert len(opened) == HERD, said
    assert len(first) == HERD, said
    assert all(v["seqs"][:1] == [1] for v in seen), said  # the first message: the replay's first event


def test_the_sockets_of_a_run_arriving_together_share_one_replay_read_whatever_their_after(
    user, run, monkeypatch
):
    """Three tabs of one run, each with a different part of it, open while the console's reader is busy:
    one read of the run's events serves them all (from the lowest seq any has), each gets exactly what
    its page lacks, in order, then the run's state."""
    from loops import selectors
    from web.console import tail as console_tail

    cookie = session_cookie(user)
    reads = []
    real_events_between = selectors.events_between

    def counted_events_between(spans):  # a read of runs' events (a replay's), counted per run
        reads.extend((run_id, after) for run_id, (after, _) in spans.items())
        return real_events_between(spans)

    monkeypatch.setattr(selectors, "events_between", counted_events_between)
    afters = [0, 2, run.last_seq - 1]

    async def go():
        stuck, freed = threading.Event(), threading.Event()

        def a_long_read():  # as a pass over other runs would hold the reader
            stuck.set()
            freed.wait(20)

        loop = asyncio.get_running_loop()
        blocked = loop.run_in_executor(console_tail._reader, a_long_read)
        await loop.run_in_executor(None, stuck.wait, 10)
        try:
            sockets = [ws_socket(f"/ws/runs/{run.pk}/?after={after}", cookie) for after in afters]
            for n, ws in enumerate(sockets, start=1):
                assert (await ws.connect(timeout=15))[0]
                for _ in range(200):  # handed to the tail, its replay still to read
                    if len(console_tail.tail().runs.get(run.pk, ())) == n:
                        break
                    await asyncio.sleep(0.05)
        finally:
            freed.set()
            await blocked
        got = [
            (await receive_events(ws, run.last_seq - after, timeout=20))[0]
            for ws, after in zip(sockets, afters, strict=True)
        ]
        states = [await ws.receive_from(timeout=20) for ws in sockets]  # then each its run's state
        for ws in sockets:
            await ws.disconnect()
        return got, states

    got, states = asyncio.run(go())
    for found, after in zip(got, afters, strict=True):
        assert [seq for seq, _ in found] == list(range(after + 1, run.last_seq + 1))
    assert all(f'id="run-{run.pk}-summary"' in state for state in states)
    assert [r for r in reads if r[0] == run.pk] == [(run.pk, 0)], reads  # one read for the three


def test_a_persons_sockets_to_many_runs_cost_a_few_ownership_reads_and_a_strangers_run_stays_closed(
    user, other_user, make_instance, start_run, monkeypatch
):
    """Every tab of one person opening at once, each on another run, plus one on a run of someone else:
    the runs they ask about while an ownership read is in flight are checked together by the next read
    (not one read each), and the run that is not theirs is still refused with 4404."""
    from loops import selectors

    mine = [start_run(make_instance(user, name=f"mine-{n}")) for n in range(8)]
    theirs = start_run(make_instance(other_user, name="theirs"))
    cookie = session_cookie(user)
    reads = []
    real_run_for, real_runs_for = selectors.run_for, selectors.runs_for

    def counted_run_for(who, run_id):  # one run's ownership read, counted
        reads.append([run_id])
        return real_run_for(who, run_id)

    def counted_runs_for(who):  # a read of the person's runs, counted
        reads.append("runs")
        return real_runs_for(who)

    monkeypatch.setattr(selectors, "run_for", counted_run_for)
    monkeypatch.setattr(selectors, "runs_for", counted_runs_for)

    async def go():
        sockets = [ws_socket(f"/ws/runs/{run.pk}/?after=0", cookie) for run in [*mine, theirs]]
        await asyncio.gather(*(ws.connect(timeout=20) for ws in sockets))
        closes = []
        for ws in sockets:  # its replay's first event, or its close
            message = await ws.receive_output(timeout=20)
            closes.append(message["code"] if message["type"] == "websocket.close" else None)
        for ws in sockets[:-1]:
            await ws.disconnect()
        return closes

    closes = asyncio.run(go())
    assert closes[-1] == 4404 and closes[:-1] == [None] * len(mine)
    assert len(reads) <= 3, reads  # one read for the first socket's run, then one for the rest
