"""Websockets for the console: authorize, replay from a seq, then forward. No business logic.

`/ws/runs/<run>/?after=SEQ` sends every event of the run with a seq above SEQ, oldest
first, one message per event (the rendered timeline fragment, carrying its seq), then
keeps sending new ones as they are recorded; after each batch it sends the run's
summary, budget and chart as they stand. `/ws/fleet/` sends the fleet page's live
blocks on connect and again whenever any of the user's runs records an event.

The database is the source of truth. Each socket tails it (every
TETHER_CONSOLE_POLL_SECONDS: 0.25 s by default, 2 s with Redis); with REDIS_URL the socket also joins
the run's (or the fleet's) group, where `loops.events.ring` rings a doorbell after each
commit, so it wakes at once and polls only as a fallback. A doorbell carries no data,
so a missed or duplicated one changes nothing.

Refusals: the socket is accepted and then closed with a code the page understands —
4403 without a signed-in session (or once the session is gone: checked every
TETHER_CONSOLE_SESSION_CHECK_SECONDS, 15 s by default), 4404 for a run that is
not the user's. The Origin check happens before (AllowedHostsOriginValidator in asgi.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from loops import events, selectors
from loops.console import live

log = logging.getLogger(__name__)

CLOSE_SIGNED_OUT = 4403
CLOSE_NOT_FOUND = 4404
BATCH = 200


def poll_seconds() -> float:
    """How often a socket reads the database when nothing woke it."""
    default = 2.0 if settings.REDIS_URL else 0.25
    return float(getattr(settings, "TETHER_CONSOLE_POLL_SECONDS", default))


def session_check_seconds() -> float:
    """How often a socket checks that its session still exists (a sign-out ends it)."""
    return float(getattr(settings, "TETHER_CONSOLE_SESSION_CHECK_SECONDS", 15.0))


class TailingConsumer(AsyncWebsocketConsumer):
    """A socket that wakes on a doorbell or a timer and sends what changed since its last send."""

    group: str = ""

    async def connect(self) -> None:
        self.wake = asyncio.Event()
        self.tail_task: asyncio.Task[None] | None = None
        self.joined = False
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
            return
        if not await self.authorize(user):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        if settings.REDIS_URL and self.channel_layer is not None:
            await self.channel_layer.group_add(self.group, self.channel_name)
            self.joined = True
        self.tail_task = asyncio.create_task(self.tail())

    async def disconnect(self, code: int) -> None:
        if self.tail_task is not None:
            self.tail_task.cancel()
            self.tail_task = None
        if self.joined:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.joined = False

    async def run_doorbell(self, message: dict[str, Any]) -> None:
        self.wake.set()

    async def authorize(self, user: Any) -> bool:
        raise NotImplementedError

    async def send_changes(self) -> bool:
        """Send what changed; return True when there may be more to send at once."""
        raise NotImplementedError

    async def tail(self) -> None:
        interval, check_every = poll_seconds(), session_check_seconds()
        loop = asyncio.get_running_loop()
        next_session_check = loop.time() + check_every
        try:
            while True:
                self.wake.clear()  # before reading: a doorbell during the read wakes the next wait
                more = await self.send_changes()
                if loop.time() >= next_session_check:
                    next_session_check = loop.time() + check_every
                    if not await self.session_alive():
                        await self.close(code=CLOSE_SIGNED_OUT)
                        return
                if more:
                    continue
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=interval)
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "console socket %s failed; closing it so the page reconnects", self.scope.get("path")
            )
            await self.close(code=1011)

    async def session_alive(self) -> bool:
        """Return False once the user signed out (logging out does not close open sockets)."""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        if session is None or key is None:
            return False
        return await database_sync_to_async(session.exists)(key)


class RunConsumer(TailingConsumer):
    """`/ws/runs/<run_id>/?after=SEQ`: a run's events after SEQ, then live."""

    async def authorize(self, user: Any) -> bool:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = events.group_name(self.run_id)
        self.sent = after_seq(self.scope.get("query_string", b""))
        run = await database_sync_to_async(selectors.run_for)(user, self.run_id)
        return run is not None

    async def send_changes(self) -> bool:
        messages, more = await database_sync_to_async(self.read)()
        for message in messages:
            await self.send(text_data=message)
        return more

    def read(self) -> tuple[list[str], bool]:
        """Render the events after the last one sent, and the run's state if any were found."""
        found = selectors.events_after(self.run_id, self.sent, BATCH)
        if not found:
            return [], False
        messages = [live.render_event(event) for event in found]
        self.sent = found[-1].seq
        more = len(found) == BATCH
        if not more:
            run = selectors.run_for(self.scope["user"], self.run_id)
            if run is not None:
                messages.append(live.render_state(run))
        return messages, more


class FleetConsumer(TailingConsumer):
    """`/ws/fleet/`: the fleet page's live blocks, now and whenever the user's runs change."""

    group = events.FLEET_GROUP

    async def authorize(self, user: Any) -> bool:
        self.version: tuple[int, int] | None = None
        return True

    async def send_changes(self) -> bool:
        message = await database_sync_to_async(self.read)()
        if message is not None:
            await self.send(text_data=message)
        return False

    def read(self) -> str | None:
        user = self.scope["user"]
        version = selectors.fleet_version(user)
        if version == self.version:
            return None
        self.version = version
        return live.render_fleet(user)


def after_seq(query_string: bytes) -> int:
    """Return the `after` of a query string: the last seq the client has (0 when absent or bad)."""
    values = parse_qs(query_string.decode("latin-1")).get("after", [])
    try:
        return max(0, int(values[-1]))
    except (IndexError, ValueError):
        return 0
