"""Sockets by the hundred: a handshake never waits behind the console's reads, one person's many
sockets cost one sign-in check, and (on PostgreSQL) a hop to the database reuses its connection."""

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import Client

from tests.console.test_consumers import receive_events, session_cookie, socket

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_console_reads_in_its_own_thread_and_a_handshake_does_not_wait_for_it(user, run):
    readers = []

    def opened(sender, connection, **kwargs):
        readers.append(threading.current_thread().name)

    from web.console import tail as console_tail

    console_tail._reader.submit(connections.close_all).result()  # its next read opens one, seen below
    connection_created.connect(opened)
    cookie = session_cookie(user)

    async def go():
        first = socket(f"/ws/runs/{run.pk}/?after=0", cookie)
        assert (await first.connect(timeout=15))[0]
        await receive_events(first, run.last_seq, timeout=10)  # the replay, read by the reader thread
        stuck, freed = threading.Event(), threading.Event()

        def a_long_read():  # as a pass over a flood of runs would hold the reader
            stuck.set()
            freed.wait(20)

        blocked = asyncio.get_running_loop().run_in_executor(console_tail._reader, a_long_read)
        await asyncio.get_running_loop().run_in_executor(None, stuck.wait, 10)
        try:
            second = socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", cookie)
            accepted = (await second.connect(timeout=5))[0]  # its session and user: not the reader's to serve
        finally:
            freed.set()
            await blocked
        await second.disconnect()
        await first.disconnect()
        return accepted

    try:
        assert asyncio.run(go())
    finally:
        connection_created.disconnect(opened)
    assert any(name.startswith("tether-console-reader") for name in readers), readers


def test_one_persons_many_sockets_cost_one_sign_in_check(user, run, settings, monkeypatch):
    settings.TETHER_WS_AUTH_RECHECK_SECONDS = 0.5
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    loads = []
    real_load = SessionStore.load

    def counted(self):  # Django's own session read, counted
        loads.append(self.session_key)
        return real_load(self)

    async def go():
        sockets = [socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", cookie) for _ in range(10)]
        for ws in sockets:
            assert (await ws.connect(timeout=15))[0]
        monkeypatch.setattr(SessionStore, "load", counted)
        await asyncio.sleep(2.0)  # each socket checks about five times
        checked = len(loads)
        await database_sync_to_async(client.post)("/logout/")
        closes = []
        for ws in sockets:
            while True:
                message = await ws.receive_output(timeout=3)
                if message["type"] == "websocket.close":
                    closes.append(message["code"])
                    break
        return checked, closes

    checked, closes = asyncio.run(go())
    assert closes == [4403] * 10  # every socket of the session that ended, within the interval
    assert 1 <= checked <= 25, checked  # one socket alone checks 5 times; ten unshared would be 50


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server process per connection")
def test_hops_to_the_database_reuse_one_postgresql_connection(db):
    def backend():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    async def go():
        return [await database_sync_to_async(backend)() for _ in range(3)]

    pids = asyncio.run(go())
    assert len(set(pids)) == 1, pids  # opened once, pinged before reuse, not opened for every hop
