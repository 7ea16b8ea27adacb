"""A console socket on the Redis channel layer stays up through a long quiet spell, then still gets
woken by the doorbell (redis-py 8's default 5 s read timeout used to close idle sockets with 1011)."""

import asyncio
import os

import pytest
import redis
from channels.db import database_sync_to_async

from tests.console.conftest import ONE_ITERATION, record
from tests.console.test_consumers import receive_events, session_cookie, socket
from tether.settings import redis_channel_layer

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_SECONDS = 20


@pytest.fixture
def redis_layer(settings):
    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15"
    try:
        redis.Redis.from_url(url, socket_timeout=2).ping()
    except redis.RedisError:
        if os.environ.get("REDIS_URL") or os.environ.get("CI"):
            raise
        pytest.skip(f"no Redis at {url} (CI always has one)")
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {"default": redis_channel_layer(url)}
    # Only a doorbell can deliver within the wait below: the socket's fallback poll is an hour.
    settings.TETHER_CONSOLE_POLL_SECONDS = 3600
    return url


def test_an_idle_socket_survives_and_is_woken_by_the_next_event(user, instance, start_run, redis_layer):
    run = start_run(instance)
    record(run, ONE_ITERATION)
    run.refresh_from_db()
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", cookie)
        connected, _ = await ws.connect()
        assert connected
        # Quiet for longer than any read timeout of the layer's client; the socket must not be closed.
        assert await ws.receive_nothing(timeout=IDLE_SECONDS, interval=0.5)
        await database_sync_to_async(record)(run, [("interjection.queued", {"id": 1, "text": "still there?", "by": "ada"})])
        found, _ = await receive_events(ws, 1, timeout=10)
        await ws.disconnect()
        return found

    found = asyncio.run(go())
    assert [seq for seq, _ in found] == [run.last_seq + 1] and "still there?" in found[0][1]


def test_a_doorbell_wakes_only_the_fleet_pages_of_the_runs_owner(user, other_user, instance, start_run, redis_layer):
    from channels.layers import get_channel_layer

    from loops import events

    run = start_run(instance)  # the user's

    async def go():
        layer = get_channel_layer()
        mine, theirs = await layer.new_channel(), await layer.new_channel()
        await layer.group_add(events.fleet_group(user.pk), mine)
        await layer.group_add(events.fleet_group(other_user.pk), theirs)
        await database_sync_to_async(events.ring)(run.pk, 7)
        woken = await asyncio.wait_for(layer.receive(mine), timeout=5)
        while woken["seq"] != 7:  # the run's own start may still be ringing
            woken = await asyncio.wait_for(layer.receive(mine), timeout=5)
        try:
            leaked = await asyncio.wait_for(layer.receive(theirs), timeout=1.5)
        except TimeoutError:
            leaked = None
        await layer.group_discard(events.fleet_group(user.pk), mine)
        await layer.group_discard(events.fleet_group(other_user.pk), theirs)
        return woken, leaked

    woken, leaked = asyncio.run(go())
    assert (woken["run"], woken["seq"]) == (run.pk, 7)
    assert leaked is None  # another user's fleet page is not woken by this run
