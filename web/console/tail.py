"""One database tail per web process for every open console socket.

A socket hands itself to its event loop's `Tail` as soon as it is authorized, with the last seq its
page has (`?after=SEQ`): its replay is the tail's work too. The tail wakes on a doorbell, a new
socket, or every poll interval and reads, in one pass for the whole process: the last seq of every
watched run, the events that some socket of a run has not seen, from the lowest seq any of them has
(so the sockets of a run that arrive together, whatever their `after`, share one read, and each
event is rendered once whatever the number of viewers), the run's state once per change, and one
fleet version per watching user — so a fleet socket wakes only when its owner's runs change. N
viewers of a run cost the database what one does.

A pass is bounded: it renders events for runs in the order their sockets have waited (a socket that
has had nothing yet first, from when it arrived) until `TETHER_CONSOLE_EVENTS_PER_PASS` are
rendered, sends them, and the next pass starts at once with the runs left. The states (dearer to
draw) wait while any run's events are left: a herd's first messages never wait behind the whole
herd's replays, nor behind any state.

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
from django.conf import settings
from django.db.models import Count, Sum

from loops import selectors
from loops.models import Run
from web.console import live

log = logging.getLogger(__name__)

BATCH = 200  # events read per run per pass; a bigger gap is read on the next pass, at once

_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-console-reader")


def events_per_pass() -> int:
    """How many events one pass renders before it sends them (`TETHER_CONSOLE_EVENTS_PER_PASS`; one run's
    batch is never split)."""
    return int(settings.TETHER_CONSOLE_EVENTS_PER_PASS)


def states_per_pass() -> int:
    """How many runs' states one pass draws at most (`TETHER_CONSOLE_STATES_PER_PASS`)."""

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
    after: dict[int, int] = field(default_factory=dict)  # run -> the seq its events were read after
    current: dict[int, int] = field(default_factory=dict)  # run -> its last seq, for runs with nothing new
    states: dict[tuple[int, bool], str] = field(default_factory=dict)
    summaries: dict[int, str] = field(default_factory=dict)
    more: bool = False
    left: bool = False  # some run's new events were left for the next pass (the pass's budget was spent)
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
        self.unserved: dict[RunWatcher, float] = {}  # a socket that has had nothing yet -> since when
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
        self.unserved[watcher] = time.monotonic()
        self.refreshed.setdefault(watcher.run_id, time.monotonic())
        self._start()

    def watch_fleet(self, watcher: FleetWatcher) -> None:
        self.fleets.setdefault(watcher.user.pk, set()).add(watcher)
        self._start()

    def forget(self, watcher: Any) -> None:
        self.unserved.pop(watcher, None)
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
        from web.consumers import poll_seconds, refresh_seconds  # lazy: web.consumers imports this module

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
        waiting: dict[int, float] = {}  # run -> since when its longest-waiting socket has had nothing
        for watcher, since in self.unserved.items():
            waiting[watcher.run_id] = min(since, waiting.get(watcher.run_id, since))
        return {
            "now": now,
            "stale": dict(self.stale),
            "states": states_per_pass(),
            "events": events_per_pass(),
            "runs": {run_id: min(w.sent for w in watchers) for run_id, watchers in self.runs.items()},
            "order": sorted(self.runs, key=lambda run_id: waiting.get(run_id, now)),
            "variants": {run_id: {w.chart_all for w in watchers} for run_id, watchers in self.runs.items()},
            "due": {run_id for run_id, at in self.refreshed.items() if now - at >= refresh},
            "users": {user_id: next(iter(ws)).user for user_id, ws in self.fleets.items()},
            "versions": {user_id: {w.version for w in watchers} for user_id, watchers in self.fleets.items()},
        }

    def read(self, plan: dict[str, Any]) -> Pass:
        """Read and render, in a worker thread, what the watchers lack (see the module doc).

        The runs' events go out first, those of the runs whose sockets waited longest first, up to
        `plan["events"]` rendered events (a run's batch whole); the runs left are the next pass's, at
        once. The states (a run page's summary, budget and chart, far dearer to draw) are drawn only
        in a pass that left no run's events, for at most `plan["states"]` runs, those waiting longest
        first, and the rest in the passes that follow at once: the events never wait for the drawing.
        """
        self.stats.passes += 1
        found = Pass()
        runs: dict[int, int] = plan["runs"]
        stale: dict[int, float] = {run_id: since for run_id, since in plan["stale"].items() if run_id in runs}
        seqs: dict[int, tuple[int, str]] = {}
        if runs:
            seqs = {
                pk: (last_seq, status)
                for pk, last_seq, status in Run.objects.filter(pk__in=list(runs)).values_list(
                    "pk", "last_seq", "status"
                )
            }
        rendered, partial, summaries, spans = 0, set(), [], {}
        for run_id in plan["order"]:
            if run_id not in seqs:
                continue
            low, (last_seq, status) = runs[run_id], seqs[run_id]
            if last_seq > low:
                if rendered >= plan["events"]:
                    found.left = found.more = True
                    continue
                spans[run_id] = (low, min(last_seq, low + BATCH))
                rendered += spans[run_id][1] - low
                if spans[run_id][1] < last_seq:  # its state waits until its last event is out
                    found.more = True
                    partial.add(run_id)
                else:
                    stale.setdefault(run_id, plan["now"])
            else:
                found.current[run_id] = last_seq
                if run_id in plan["due"] and status != Run.Status.FINISHED and run_id not in stale:
                    summaries.append(run_id)
        for run_id, batch in selectors.events_between(spans).items():  # one read for every run's events
            found.after[run_id] = spans[run_id][0]
            found.events[run_id] = [(e.seq, live.render_event(e)) for e in batch]
            self.stats.rendered_events += len(batch)
        if not found.left:
            drawing = [run_id for run_id in sorted(stale, key=stale.__getitem__) if run_id not in partial]
            drawing = drawing[: plan["states"]]
            rows = (
                Run.objects.select_related("instance").in_bulk(drawing + summaries)
                if drawing or summaries
                else {}
            )
            for run_id in drawing:
                if (run := rows.get(run_id)) is not None:
                    for chart_all in plan["variants"][run_id]:
                        found.states[(run_id, chart_all)] = live.render_state(run, chart_all)
                        self.stats.rendered_states += 1
                del stale[run_id]
            for run_id in summaries:
                if (run := rows.get(run_id)) is not None:
                    found.summaries[run_id] = live.render_summary(run)
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
        first = [
            *found.events,
            *(run_id for run_id in self.runs if run_id not in found.events),
        ]  # events first
        for run_id in first:
            watchers = self.runs.get(run_id, set())
            batch = found.events.get(run_id, [])
            summary = found.summaries.get(run_id)
            if batch or summary:
                self.refreshed[run_id] = now
            for watcher in list(watchers):
                if batch and watcher.sent < found.after[run_id]:
                    continue  # it came after the pass began, lacking more than was read: the next pass's
                messages = [html for seq, html in batch if seq > watcher.sent]
                last = max([watcher.sent] + [seq for seq, _ in batch])
                state = found.states.get((run_id, watcher.chart_all))
                if state is not None:
                    messages.append(state)
                elif not messages and summary is not None:
                    messages.append(summary)
                if messages or watcher.sent >= found.current.get(run_id, last + 1):
                    self.unserved.pop(watcher, None)  # served: it had its first message, or lacks nothing
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
