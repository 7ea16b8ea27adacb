"""Websockets for the console: authorize, replay from a seq, then forward. No business logic.

`/ws/runs/<run>/?after=SEQ` sends every event of the run with a seq above SEQ, oldest
first, one message per event (the rendered timeline fragment, carrying its seq), then
keeps sending new ones as they are recorded; after each batch it sends the run's
summary, actions, budget and chart as they stand; while the run is live and nothing happens,
it re-sends the summary every TETHER_CONSOLE_REFRESH_SECONDS (5 s) so that a worker gone quiet
shows (see web.console.display.worker_note). `/ws/fleet/` sends the fleet page's live
blocks on connect and again whenever any of the user's runs records an event.

The database is the source of truth. A socket hands itself, with the last seq its page has, to its
web process's one tail (web.console.tail), which replays what it lacks and then keeps it fed: the
tail reads for every socket at once (every TETHER_CONSOLE_POLL_SECONDS: 0.25 s by default, 2 s with
Redis, and at once when a socket arrives) and renders each event once however many watch it; with
REDIS_URL the socket also joins the run's (or the fleet's) group, where `loops.events.ring` rings a
doorbell after each commit, which wakes the tail at once (it polls only as a fallback). A doorbell
carries no data, so a missed or duplicated one changes nothing.

Refusals: the socket is accepted and then closed with a code the page understands —
4403 without a signed-in session, and within TETHER_WS_AUTH_RECHECK_SECONDS (5 s by
default) of that sign-in ending: a sign-out, the user deactivated, or their password
changed (the session's auth hash no longer matches) — 4404 for a run that is not the
user's. Sockets take the session only, never an API token. The Origin check happens
before (tether.origin.SameOriginValidator in asgi.py).

A herd (every tab reconnecting in the same second after a restart) shares its work: the sockets
of one sign-in opening together cost one session check (`HerdAuthMiddlewareStack`), the sockets of
one person's runs one ownership read per batch (`herd`: the runs its sockets ask about while a
read is in flight are checked together by the next; nothing is kept after), and the sockets of a run one replay read
per pass of the tail, the first messages before any state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from importlib import import_module
from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddleware, get_user
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware, get_token

from loops import events, selectors
from web.console import live
from web.console import tail as console_tail

log = logging.getLogger(__name__)

CLOSE_SIGNED_OUT = 4403
CLOSE_NOT_FOUND = 4404
LAYER_CALLS_AT_ONCE = 32


def poll_seconds() -> float:
    """How often a socket reads the database when nothing woke it."""
    return float(settings.TETHER_CONSOLE_POLL_SECONDS)


def session_check_seconds() -> float:
    """How often a socket checks that its user is still signed in (see the module doc)."""
    return float(settings.TETHER_WS_AUTH_RECHECK_SECONDS)


class TailingConsumer(AsyncWebsocketConsumer):
    """A socket fed by its process's tail (web.console.tail), its replay included."""

    group: str = ""

    async def connect(self) -> None:
        self.tail_task: asyncio.Task[None] | None = None
        self.joined = False
        self.watching: console_tail.Tail | None = None
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
            return
        if not await self.authorize(user):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        if settings.REDIS_URL and self.channel_layer is not None:
            async with herd().layer_calls:  # a herd's joins queue for the layer's connections (100)
                await self.channel_layer.group_add(self.group, self.channel_name)
            self.joined = True
        self.tail_task = asyncio.create_task(self.tail())

    async def disconnect(self, code: int) -> None:
        if self.watching is not None:
            self.watching.forget(self)
            self.watching = None
        if self.tail_task is not None:
            self.tail_task.cancel()
            self.tail_task = None
        if self.joined:
            async with herd().layer_calls:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            self.joined = False

    async def dispatch(self, message: dict[str, Any]) -> None:
        """channels' dispatch without its hop to the sync thread before every message (to close old
        database connections): a herd's handshakes, and every doorbell to every socket, queued there
        behind each other and every HTTP request. This consumer touches the database only through
        `database_sync_to_async` and the console's reader, which close old connections around each call."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def run_doorbell(self, message: dict[str, Any]) -> None:
        console_tail.tail().ring()

    async def authorize(self, user: Any) -> bool:
        raise NotImplementedError

    def watch(self, found: console_tail.Tail) -> None:
        raise NotImplementedError

    async def tail(self) -> None:
        try:
            self.watching = console_tail.tail()
            self.watch(self.watching)
            check_every = session_check_seconds()
            while True:
                # Checked 0.8 of the interval apart on answers at most 0.2 old: ended within the interval.
                await asyncio.sleep(check_every * 0.8)
                if not await self.session_alive():
                    await self.close(code=CLOSE_SIGNED_OUT)
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "console socket %s failed; closing it so the page reconnects", self.scope.get("path")
            )
            await self.close(code=1011)

    async def session_alive(self) -> bool:
        """Return False once the socket's sign-in ended (logging out does not close open sockets).

        The session is read afresh and checked the way Django checks every request: it must
        exist, name this user, its user must be active, and its auth hash must match the
        password's (a password change ends other sessions).
        """
        key = getattr(self.scope.get("session"), "session_key", None)
        if key is None:
            return False
        within = session_check_seconds() * 0.2
        return await console_tail.tail().signed_in_as(key, within, signed_in_as) == self.scope["user"].pk


async def signed_in_as(session_key: str) -> Any:
    """Return the pk of the user whose sign-in `session_key` is, read afresh; None when there is none."""
    fresh = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    current = await get_user({"session": fresh})
    return current.pk if current.is_authenticated else None


def refresh_seconds() -> float:
    """How often a live run's summary is re-sent when no event came."""
    return float(settings.TETHER_CONSOLE_REFRESH_SECONDS)


class RunConsumer(TailingConsumer):
    """`/ws/runs/<run_id>/?after=SEQ`: a run's events after SEQ, then live."""

    async def authorize(self, user: Any) -> bool:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = events.group_name(self.run_id)
        self.sent = after_seq(self.scope.get("query_string", b""))
        self.chart_all = b"chart=all" in self.scope.get("query_string", b"").split(b"&")
        owns = await herd().owns(user, self.run_id)
        if settings.CSRF_USE_SESSIONS:  # the token is in the session: a read
            self.csrf_token = await database_sync_to_async(viewer_csrf_token)(self.scope)
        else:  # the cookie's: no read, no hop to a thread
            self.csrf_token = viewer_csrf_token(self.scope)
        return owns

    async def send_fragment(self, message: str) -> None:
        """Send one message, its forms filled for this viewer (see live.for_viewer)."""
        await self.send(text_data=live.for_viewer(message, self.csrf_token))

    def watch(self, found: console_tail.Tail) -> None:
        found.watch_run(self)

    async def deliver(self, messages: list[str], last_seq: int) -> None:
        for message in messages:
            await self.send_fragment(message)
        self.sent = last_seq


def owned_runs(user: Any, run_ids: list[int]) -> set[int]:
    """Return which of `run_ids` are the user's (one read)."""
    return set(selectors.runs_for(user).filter(pk__in=run_ids).values_list("pk", flat=True))


class FleetConsumer(TailingConsumer):
    """`/ws/fleet/`: the fleet page's live blocks, now and whenever the user's runs change."""

    async def authorize(self, user: Any) -> bool:
        self.user = user
        self.group = events.fleet_group(user.pk)  # woken by its owner's runs only
        self.version: tuple[int, int] | None = None
        return True

    def watch(self, found: console_tail.Tail) -> None:
        found.watch_fleet(self)

    async def deliver_fleet(self, message: str, version: tuple[int, int]) -> None:
        await self.send(text_data=message)
        self.version = version


def viewer_csrf_token(scope: dict[str, Any]) -> str:
    """Return a CSRF token of the socket's sign-in (its cookie, or its session with CSRF_USE_SESSIONS).

    "" when it has none that is valid: a token made up here would match no cookie.
    """
    request = HttpRequest()
    request.COOKIES = dict(scope.get("cookies") or {})
    session = scope.get("session")
    if session is not None:
        request.session = session
    CsrfViewMiddleware(lambda _: None).process_request(request)
    if "CSRF_COOKIE" not in request.META or request.META.get("CSRF_COOKIE_NEEDS_UPDATE"):
        return ""
    return get_token(request)


def after_seq(query_string: bytes) -> int:
    """Return the `after` of a query string: the last seq the client has (0 when absent or bad)."""
    values = parse_qs(query_string.decode("latin-1")).get("after", [])
    try:
        return max(0, int(values[-1]))
    except (IndexError, ValueError):
        return 0


# --- a herd of handshakes shares its reads ----------------------------------------------------------


class Herd:
    """Single flight for one event loop: the first socket to ask for `key` starts the read, and every
    socket asking the same while that read runs waits for it and gets its answer (or its error).

    Nothing is remembered once the read is done: the next socket reads afresh, so an answer is never
    older than a read the socket would have made itself. The read runs as a task of its own
    (shielded), so a socket that closes while it waits leaves the answer to the rest.
    """

    def __init__(self) -> None:
        self.reading: dict[Any, asyncio.Future[Any]] = {}
        self.reads = 0  # reads started (a test or a benchmark reads it)
        # Ownership checks: one read at a time; the runs a person's sockets ask about meanwhile wait
        # for the next, together (one read for a herd's hundred runs, not one each).
        self.checking = asyncio.Lock()
        self.asking: dict[int, tuple[Any, set[int], asyncio.Future[set[int]]]] = {}
        # Joins and leaves of channel-layer groups at once: a Redis layer has 100 connections per
        # pool (redis-py's default) and refuses the 101st ("Too many connections": a 1011).
        self.layer_calls = asyncio.Semaphore(LAYER_CALLS_AT_ONCE)

    async def share(self, key: Any, ask: Callable[[], Awaitable[Any]]) -> Any:
        running = self.reading.get(key)
        if running is None:
            self.reads += 1
            running = self.reading[key] = asyncio.ensure_future(ask())
            running.add_done_callback(lambda done, key=key: self._done(key, done))
        return await asyncio.shield(running)

    async def owns(self, user: Any, run_id: int) -> bool:
        """Whether `run_id` is the user's: checked with the other runs the user's sockets ask about
        while a check is in flight, in one read (`owned_runs`) once it is done."""
        asked = self.asking.get(user.pk)
        if asked is None:
            asked = self.asking[user.pk] = (user, set(), asyncio.get_running_loop().create_future())
            self.reads += 1
            asyncio.ensure_future(self._check(user.pk, asked))
        asked[1].add(run_id)
        return run_id in await asyncio.shield(asked[2])

    async def _check(self, key: int, asked: tuple[Any, set[int], asyncio.Future[set[int]]]) -> None:
        user, run_ids, answer = asked
        async with self.checking:
            if self.asking.get(key) is asked:
                del self.asking[key]  # from here on, sockets asking wait for the next read
            try:
                answer.set_result(await database_sync_to_async(owned_runs)(user, sorted(run_ids)))
            except Exception as exc:  # every socket that asked gets it
                answer.set_exception(exc)
                answer.exception()  # retrieved: a socket gone meanwhile does not leave it "never retrieved"

    def _done(self, key: Any, done: asyncio.Future[Any]) -> None:
        if self.reading.get(key) is done:
            del self.reading[key]
        if not done.cancelled():
            done.exception()  # every waiter got it; a read no socket waits for any more is not "never retrieved"


_herds: dict[asyncio.AbstractEventLoop, Herd] = {}


def herd() -> Herd:
    """This event loop's herd (one per web process; tests run several loops in turn)."""
    loop = asyncio.get_running_loop()
    found = _herds.get(loop)
    if found is None:
        for gone in [other for other in _herds if other.is_closed()]:  # a test's loop, ended
            del _herds[gone]
        found = _herds[loop] = Herd()
    return found


class HerdAuthMiddleware(AuthMiddleware):
    """channels' AuthMiddleware, but the sockets of one sign-in that open together share one session check."""

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        key = getattr(scope.get("session"), "session_key", None)
        if not key:  # no session: anonymous, and nothing to read
            scope["user"]._wrapped = await get_user(scope)
            return
        scope["user"]._wrapped = await herd().share(("user", key), lambda: get_user(scope))


def HerdAuthMiddlewareStack(inner: Any) -> Any:  # noqa: N802 (named like channels' AuthMiddlewareStack)
    """Cookies, the session, and the user, as channels' AuthMiddlewareStack, with one check per herd."""
    return CookieMiddleware(SessionMiddleware(HerdAuthMiddleware(inner)))
