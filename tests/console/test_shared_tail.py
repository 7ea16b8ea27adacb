"""Many sockets, one tail: N viewers of a run cost the database and the renderer what one does, each
gets every event exactly once, and a fleet socket hears only about its own user's runs."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from tests.console.conftest import ONE_ITERATION, record
from tests.console.test_consumers import SEQ, receive_events, session_cookie, socket
from web.console import tail as console_tail

pytestmark = pytest.mark.django_db(transaction=True)

VIEWERS = 25
NEW = [
    ("interjection.queued", {"id": 1, "text": "one", "by": "ada"}),
    ("interjection.queued", {"id": 2, "text": "two", "by": "ada"}),
    ("interjection.queued", {"id": 3, "text": "three", "by": "ada"}),
]


def test_many_viewers_share_one_read_and_one_render_per_event(
    settings, user, other_user, make_instance, start_run
):
    settings.TETHER_CONSOLE_REFRESH_SECONDS = 3600  # no periodic summary in between
    run = start_run(make_instance(user))
    record(run, ONE_ITERATION)
    run.refresh_from_db()
    mine, theirs = session_cookie(user), session_cookie(other_user)

    async def go():
        viewers = [socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", mine) for _ in range(VIEWERS)]
        fleet = socket("/ws/fleet/", mine)
        strangers = [socket("/ws/fleet/", theirs) for _ in range(3)]
        for ws in [*viewers, fleet, *strangers]:
            assert (await ws.connect(timeout=15))[0]
        await fleet.receive_from(timeout=5)  # the fleet as it stands
        for ws in strangers:
            await ws.receive_from(timeout=5)
        shared = console_tail.tail()
        before = shared.stats.rendered_events, shared.stats.rendered_states, shared.stats.passes
        await database_sync_to_async(record)(run, NEW)
        got = [await receive_events(ws, len(NEW), timeout=10) for ws in viewers]
        for ws in viewers:  # the state after the batch, then nothing more
            state = await ws.receive_from(timeout=5)
            assert SEQ.match(state) is None and f'id="run-{run.pk}-summary"' in state
            assert await ws.receive_nothing(timeout=0.2)
        fleet_update = await fleet.receive_from(timeout=5)
        quiet = [await ws.receive_nothing(timeout=0.5) for ws in strangers]
        after = shared.stats.rendered_events, shared.stats.rendered_states, shared.stats.passes
        for ws in [*viewers, fleet, *strangers]:
            await ws.disconnect()
        return got, fleet_update, quiet, before, after

    got, fleet_update, quiet, before, after = asyncio.run(go())
    first = run.last_seq
    for found, _ in got:
        assert [seq for seq, _ in found] == [first + 1, first + 2, first + 3]
    # Three events rendered three times in all (not once per viewer), the state once.
    assert after[0] - before[0] == len(NEW) and after[1] - before[1] == 1
    assert "fleet" in fleet_update and all(quiet)


def test_a_viewer_that_joins_late_replays_by_itself_then_shares_the_tail(user, make_instance, start_run):
    run = start_run(make_instance(user))
    record(run, ONE_ITERATION)
    run.refresh_from_db()
    cookie = session_cookie(user)

    async def go():
        early = socket(f"/ws/runs/{run.pk}/?after={run.last_seq}", cookie)
        assert (await early.connect(timeout=15))[0]
        await database_sync_to_async(record)(run, NEW[:1])
        one, _ = await receive_events(early, 1, timeout=10)
        late = socket(f"/ws/runs/{run.pk}/?after=0", cookie)  # a fresh page: everything so far
        assert (await late.connect(timeout=15))[0]
        replay, _ = await receive_events(late, run.last_seq + 1, timeout=10)
        await database_sync_to_async(record)(run, NEW[1:])
        more_early, _ = await receive_events(early, 2, timeout=10)
        more_late, _ = await receive_events(late, 2, timeout=10)
        await early.disconnect()
        await late.disconnect()
        return one, replay, more_early, more_late

    one, replay, more_early, more_late = asyncio.run(go())
    last = run.last_seq
    assert [s for s, _ in one] == [last + 1]
    assert [s for s, _ in replay] == list(range(1, last + 2))
    assert [s for s, _ in more_early] == [s for s, _ in more_late] == [last + 2, last + 3]


class Recording:
    """A run watcher that notes, per message, which pass of the tail sent it."""

    chart_all = False

    def __init__(self, shared, run):
        self.shared, self.run_id, self.sent, self.got = shared, run.pk, run.last_seq, []

    async def deliver(self, messages, last_seq):
        self.sent = last_seq
        self.got += [(self.shared.stats.passes, "event" if SEQ.match(m) else "state") for m in messages]


def test_a_pass_sends_every_runs_events_and_draws_at_most_its_share_of_states(
    settings, user, make_instance, start_run
):
    settings.TETHER_CONSOLE_REFRESH_SECONDS = 3600
    settings.TETHER_CONSOLE_STATES_PER_PASS = 1
    runs = [start_run(make_instance(user, name=f"fleet-{n}")) for n in range(3)]
    for run in runs:
        run.refresh_from_db()

    async def go():
        shared = console_tail.Tail()
        watchers = [Recording(shared, run) for run in runs]
        for run in runs:
            await database_sync_to_async(record)(run, NEW)
        for watcher in watchers:
            shared.watch_run(watcher)
        for _ in range(100):
            if all(sum(kind == "state" for _, kind in w.got) for w in watchers):
                break
            await asyncio.sleep(0.05)
        for watcher in watchers:
            shared.forget(watcher)
        return watchers

    watchers = asyncio.run(go())
    first = min(pass_ for w in watchers for pass_, _ in w.got)
    for watcher in watchers:  # every run's events in the first pass
        assert [p for p, kind in watcher.got if kind == "event"] == [first] * len(NEW)
    # one state per pass, the runs waiting longest first; every run's state came
    states = sorted(p for w in watchers for p, kind in w.got if kind == "state")
    assert states == [first, first + 1, first + 2]


def test_a_herds_first_messages_wait_neither_for_the_other_runs_replays_nor_for_any_state(
    settings, user, make_instance, start_run
):
    """Sockets of four runs with history arrive together, each lacking everything (`after=0`). A pass
    renders at most its budget of events and sends them: each socket's whole replay comes in a pass of
    its own, in the order they arrived, and not one state is sent before the last first message."""
    settings.TETHER_CONSOLE_REFRESH_SECONDS = 3600
    settings.TETHER_CONSOLE_EVENTS_PER_PASS = 1  # one run's replay per pass (a run's batch is never split)
    runs = [start_run(make_instance(user, name=f"herd-{n}")) for n in range(4)]
    for run in runs:
        record(run, ONE_ITERATION)
        run.refresh_from_db()
    sent: list[tuple[int, str]] = []  # (run, kind) in the order the tail sent them, across sockets

    class Logged(Recording):
        async def deliver(self, messages, last_seq):
            await super().deliver(messages, last_seq)
            sent.extend((self.run_id, "event" if SEQ.match(m) else "state") for m in messages)

    async def go():
        shared = console_tail.Tail()
        watchers = [Logged(shared, run) for run in runs]
        for watcher in watchers:
            watcher.sent = 0  # a fresh page: the whole run to replay
            shared.watch_run(watcher)
        for _ in range(200):
            if all(sum(kind == "state" for _, kind in w.got) for w in watchers):
                break
            await asyncio.sleep(0.05)
        for watcher in watchers:
            shared.forget(watcher)
        return watchers

    watchers = asyncio.run(go())
    replays = []
    for watcher, run in zip(watchers, runs, strict=True):
        events = [p for p, kind in watcher.got if kind == "event"]
        assert len(events) == run.last_seq and len(set(events)) == 1  # the whole replay, in one pass
        replays.append(events[0])
        assert watcher.got[-1][1] == "state"  # its state after its events, as a replay always ended
    assert replays == sorted(replays) and len(set(replays)) == len(runs)  # one run per pass, first come first
    first_state = sent.index(next(item for item in sent if item[1] == "state"))
    last_event = max(i for i, item in enumerate(sent) if item[1] == "event")
    assert last_event < first_state  # no state sent while a socket still waited for its first message
