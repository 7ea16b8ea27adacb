"""One database tail per web process for every open console socket.

A socket replays what its page lacks by itself (`?after=SEQ`), then hands itself to its event loop's
`Tail`. The tail wakes on a doorbell or every poll interval and reads, in one pass for the whole
process: the last seq of every watched run, the events that some socket of a changed run has not
seen (each rendered once, whatever the number of viewers), the run's state once per change, and
one fleet version per watching user — so a fleet socket wakes only when its owner's runs change.
N viewers of a run cost the database what one does.

The reads and the rendering run in the process's one console reader thread (`reading`), not in
the thread that every socket's handshake (its session and user) and every HTTP request's database
work wait for: a flood of sockets replaying their runs, or a long pass, never holds up a handshake
past daphne's timeout.

Each socket's `sent` is the last seq it got, so a socket is sent every event exactly once, in
order, whichever of its replay and the tail read it first. A read that fails (the database is
down) is logged and retried at the next interval; the sockets stay open.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.db import database_sync_to_async
from django.db.models import Count, Sum

from loops import selectors
from loops.console import live
from loops.models import Run

log = logging.getLogger(__name__)

BATCH = 200  # events read per run per pass; a bigger gap is read on the next pass, at once

_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-console-reader")


def states_per_pass() -> int:
    """How many runs' states one pass draws at most (`TETHER_CONSOLE_STATES_PER_PASS`)."""
    from django.conf import settings

    return int(settings.TETHER_CONSOLE_STATES_PER_PASS)


def reading[**P, R](func: Callable[P, R]) -> Callable[P, Any]:
    """`func` as a coroutine run in the console's reader thread (one database connection of its own)."""
    return database_sync_to_async(func, thread_sensitive=False, executor=_reader)


class RunWatcher(Protocol):
    run_id: int
    sent: int
    chart_all: bool

    async def deliver(self, messages: list[str], last_seq: int) -> None: ...


class FleetWatcher(Protocol):
    user: Any
    version: tuple[int, int] | None

    async def deliver_fleet(self, message: str, version: tuple[int, int]) -> None: ...


@dataclass
class Pass:
    """What one read found: per run, the rendered events (seq, html) and the state; per user, the fleet."""

    events: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    states: dict[tuple[int, bool], str] = field(default_factory=dict)
    summaries: dict[int, str] = field(default_factory=dict)
    more: bool = False
    fleets: dict[int, tuple[tuple[int, int], str]] = field(default_factory=dict)
    stale: dict[int, float] = field(default_factory=dict)  # runs whose state is still to render, since when


@dataclass
class Stats:
    """Counters a test or a benchmark reads: reads made and fragments rendered by this tail."""

    passes: int = 0
    rendered_events: int = 0
    rendered_states: int = 0
    rendered_fleets: int = 0


class Tail:
    """The tail of one event loop (one web process serves its sockets on one loop)."""

    def __init__(self) -> None:
        self.runs: dict[int, set[RunWatcher]] = {}
        self.fleets: dict[int, set[FleetWatcher]] = {}
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.refreshed: dict[int, float] = {}  # run -> when its state or summary was last sent
        self.stale: dict[int, float] = {}  # run -> since when its events are out and its state is not
        self.stats = Stats()
        # session key -> (when asked, the answer): its user's pk, None once signed out
        self.sessions: dict[str, tuple[float, asyncio.Future[Any]]] = {}

    # --- who is signed in -------------------------------------------------------------------------

    async def signed_in_as(self, session_key: str, within: float, ask: Callable[[str], Any]) -> Any:
        """Return whose sign-in `session_key` is now (a user's pk, None once it ended), by `ask`.

        All of one session's sockets share an answer up to `within` seconds old, so a person with
        a hundred sockets open costs one check, not a hundred. A failed check fails them all.
        """
        now = time.monotonic()
        known = self.sessions.get(session_key)
        if known is None or now - known[0] > within:
            if len(self.sessions) > 1000:  # forget sessions no socket asked about lately
                self.sessions = {k: v for k, v in self.sessions.items() if now - v[0] <= within}
            known = self.sessions[session_key] = (now, asyncio.ensure_future(ask(session_key)))
        return await asyncio.shield(known[1])  # a socket closing while it waits leaves the answer to the rest

    # --- who watches ------------------------------------------------------------------------------

    def watch_run(self, watcher: RunWatcher) -> None:
        self.runs.setdefault(watcher.run_id, set()).add(watcher)
        self.refreshed.setdefault(watcher.run_id, time.monotonic())
        self._start()

    def watch_fleet(self, watcher: FleetWatcher) -> None:
        self.fleets.setdefault(watcher.user.pk, set()).add(watcher)
        self._start()

    def forget(self, watcher: Any) -> None:
        for table in (self.runs, self.fleets):
            for key, watchers in list(table.items()):
                watchers.discard(watcher)
                if not watchers:
                    del table[key]
                    if table is self.runs:
                        self.refreshed.pop(key, None)

    def ring(self) -> None:
        """A doorbell: something was recorded; read now rather than at the next interval."""
        self.wake.set()

    def _start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop(), name="tether-console-tail")
        self.wake.set()

    # --- the loop ---------------------------------------------------------------------------------

    async def _loop(self) -> None:
        from loops.consumers import poll_seconds, refresh_seconds

        while self.runs or self.fleets:
            self.wake.clear()
            try:
                found = await reading(self.read)(self._plan(refresh_seconds()))
            except Exception:
                log.warning("console tail read failed; retrying at the next interval", exc_info=True)
                found = None
            if found is not None:
                await self._deliver(found)
                self.stale = {run_id: since for run_id, since in found.stale.items() if run_id in self.runs}
                if found.more or self.stale:
                    continue
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=poll_seconds())
            except TimeoutError:
                pass

    def _plan(self, refresh: float) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "now": now,
            "stale": dict(self.stale),
            "states": states_per_pass(),
            "runs": {run_id: min(w.sent for w in watchers) for run_id, watchers in self.runs.items()},
            "variants": {run_id: {w.chart_all for w in watchers} for run_id, watchers in self.runs.items()},
            "due": {run_id for run_id, at in self.refreshed.items() if now - at >= refresh},
            "users": {user_id: next(iter(ws)).user for user_id, ws in self.fleets.items()},
            "versions": {
                user_id: {w.version for w in watchers} for user_id, watchers in self.fleets.items()
            },
        }

    def read(self, plan: dict[str, Any]) -> Pass:
        """Read and render, in a worker thread, what the watchers lack (see the module doc).

        Every run's new events go out in this pass; the states (a run page's summary, budget and
        chart, far dearer to draw) are drawn for at most `plan["states"]` runs, those waiting
        longest first, and the rest in the passes that follow at once: under a fleet's load the
        events never wait for the drawing.
        """
        self.stats.passes += 1
        found = Pass()
        runs: dict[int, int] = plan["runs"]
        stale: dict[int, float] = {run_id: since for run_id, since in plan["stale"].items() if run_id in runs}
        rows: dict[int, Run] = {}
        if runs:
            rows = {r.pk: r for r in Run.objects.select_related("instance").filter(pk__in=list(runs))}
            for run_id, low in runs.items():
                run = rows.get(run_id)
                if run is None:
                    continue
                if run.last_seq > low:
                    batch = selectors.events_after(run_id, low, BATCH)
                    found.events[run_id] = [(e.seq, live.render_event(e)) for e in batch]
                    self.stats.rendered_events += len(batch)
                    if len(batch) == BATCH:
                        found.more = True
                        continue
                    stale.setdefault(run_id, plan["now"])
                elif run_id in plan["due"] and run.status != Run.Status.FINISHED and run_id not in stale:
                    found.summaries[run_id] = live.render_summary(run)
        for run_id in sorted(stale, key=stale.__getitem__)[: plan["states"]]:
            if (run := rows.get(run_id)) is not None:
                for chart_all in plan["variants"][run_id]:
                    found.states[(run_id, chart_all)] = live.render_state(run, chart_all)
                    self.stats.rendered_states += 1
            del stale[run_id]
        found.stale = stale
        users: dict[int, Any] = plan["users"]
        if users:
            versions = {
                row["owner_id"]: (row["events"] or 0, row["runs"] or 0)
                for row in Run.objects.filter(owner_id__in=list(users))
                .values("owner_id")
                .annotate(events=Sum("last_seq"), runs=Count("id"))
            }
            for user_id, user in users.items():
                version = versions.get(user_id, (0, 0))
                if plan["versions"][user_id] != {version}:
                    found.fleets[user_id] = (version, live.render_fleet(user))
                    self.stats.rendered_fleets += 1
        return found

    async def _deliver(self, found: Pass) -> None:
        now = time.monotonic()
        for run_id, watchers in list(self.runs.items()):
            batch = found.events.get(run_id, [])
            summary = found.summaries.get(run_id)
            if batch or summary:
                self.refreshed[run_id] = now
            for watcher in list(watchers):
                messages = [html for seq, html in batch if seq > watcher.sent]
                last = max([watcher.sent] + [seq for seq, _ in batch])
                state = found.states.get((run_id, watcher.chart_all))
                if state is not None:
                    messages.append(state)
                elif not messages and summary is not None:
                    messages.append(summary)
                if messages:
                    await self._safely(watcher, watcher.deliver(messages, last))
        for user_id, (version, message) in found.fleets.items():
            for watcher in list(self.fleets.get(user_id, ())):
                if watcher.version != version:
                    await self._safely(watcher, watcher.deliver_fleet(message, version))

    async def _safely(self, watcher: Any, sending: Any) -> None:
        """Send to one socket; one that cannot take it (closed meanwhile) is dropped, never the tail."""
        try:
            await sending
        except Exception:
            log.info("console socket could not take a message; dropping it from the tail", exc_info=True)
            self.forget(watcher)


_tails: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Tail] = weakref.WeakKeyDictionary()


def tail() -> Tail:
    """Return this event loop's tail (one per web process; tests run several loops in turn)."""
    loop = asyncio.get_running_loop()
    found = _tails.get(loop)
    if found is None:
        found = _tails[loop] = Tail()
    return found
