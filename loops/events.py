"""Append events to a run's gap-free sequence; ring the doorbell after commit.

Every payload is checked against its kind's model (`loops.event_types`) before anything is
written: a kind nobody declared, or a field its model does not name, is refused (`InvalidEvent`).
Must be called inside a transaction: the run row's `last_seq` is bumped with a
conditional update, which serialises appenders of one run. Every string in an event's
data is redacted (`tether.redaction`) before it is stored. Viewers are woken
after the commit, never before, so they can always read what they are told about.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, QuerySet, Value
from django.db.models.expressions import RawSQL
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from loops.event_types import check
from loops.models import Event, Run
from tether.perprocess import PerProcess
from tether.redaction import redact_each

log = logging.getLogger(__name__)

# One round trip: bump the run's counter and learn the new value (SQLite ≥ 3.35, PostgreSQL).
_BUMP = f"UPDATE {Run._meta.db_table} SET last_seq = last_seq + %s WHERE id = %s RETURNING last_seq"


def append(run_id: int, kind: str, data: dict[str, Any] | None = None) -> int:
    """Append one event; return its seq."""
    return append_many(run_id, [(kind, data or {})])


def append_many(run_id: int, items: Iterable[tuple[str, dict[str, Any]]]) -> int:
    """Append events in order; return the last seq."""
    items = _checked(items)
    if not items:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(_BUMP, [len(items), run_id])
        last = cursor.fetchone()[0]
    _insert(run_id, last, items)
    return last


def update_and_append(runs: QuerySet[Run], fields: dict[str, Any], items: Iterable[tuple[str, dict[str, Any]]]) -> int | None:
    """Write `fields` to the run `runs` selects (by its pk, say, and its lease) and append `items` to it.

    The run's update and its sequence's bump are one `UPDATE … RETURNING`. Returns the last seq,
    or None when no run matched `runs` (then nothing is written).
    """
    written = update_and_append_if(runs, fields, items)
    return None if written is None else written[0]


def update_and_append_if(
    runs: QuerySet[Run], fields: dict[str, Any], items: Iterable[tuple[str, dict[str, Any]]],
    when: tuple[str, Sequence[Any]] | None = None, more: Iterable[tuple[str, dict[str, Any]]] = (),
) -> tuple[int, bool] | None:
    """`update_and_append`, appending `more` after `items` too if the run, as updated, matches `when`.

    `when` is an SQL condition on the run's row (its table named as such) with its parameters.
    Still one `UPDATE … RETURNING`: the condition decides the sequence's bump and comes back
    with it. Returns (the last seq, whether `more` was appended), or None when no run matched.
    """
    items, more = _checked(items), _checked(more)
    bump: Any = Value(len(items))
    if when is not None and more:
        condition, condition_params = when
        bump = RawSQL(f"CASE WHEN ({condition}) THEN %s ELSE %s END", (*condition_params, len(items) + len(more), len(items)))
    query = runs.query.chain(UpdateQuery)
    query.add_update_values({**fields, "last_seq": F("last_seq") + bump})
    sql, params = query.get_compiler(runs.db).as_sql()
    quote = connection.ops.quote_name
    returning = f"{quote('id')}, {quote('last_seq')}"
    if when is not None and more:
        returning, params = f"{returning}, CASE WHEN ({condition}) THEN 1 ELSE 0 END", (*params, *condition_params)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {returning}", params)
        found = cursor.fetchall()
    if not found:
        return None
    run_id, last, *flag = found[0]
    appended = bool(flag and flag[0])
    _insert(int(run_id), int(last), items + more if appended else items)
    return int(last), appended


def _checked(items: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Return `items` as a list once each payload is checked against its kind's model (`InvalidEvent` if not)."""
    items = list(items)
    for kind, data in items:
        check(kind, data)
    return items


def _insert(run_id: int, last: int, items: list[tuple[str, dict[str, Any]]]) -> None:
    """Insert `items` as the run's events up to seq `last` (one statement) and ring after commit."""
    if not items:
        return
    first = last - len(items) + 1
    now = timezone.now()
    datas = redact_each(data for _, data in items)
    Event.objects.bulk_create(
        Event(run_id=run_id, seq=first + i, kind=kind, data=data, created_at=now)
        for i, ((kind, _), data) in enumerate(zip(items, datas, strict=True))
    )
    transaction.on_commit(lambda: ring(run_id, last))


def append_to_each(kind: str, data: dict[int, dict[str, Any]]) -> dict[int, int]:
    """Append one event of `kind` to each run of `data` (run id → its data); return each run's seq.

    Two statements however many runs (a driver's pickup claims dozens at once).
    """
    if not data:
        return {}
    for payload in data.values():
        check(kind, payload)
    ids = list(data)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} SET last_seq = last_seq + 1 "
            f"WHERE id IN ({', '.join(['%s'] * len(ids))}) RETURNING id, last_seq",
            ids,
        )
        seqs = {int(run_id): int(seq) for run_id, seq in cursor.fetchall()}
    now = timezone.now()
    datas = redact_each(data[run_id] for run_id in seqs)
    Event.objects.bulk_create(
        Event(run_id=run_id, seq=seq, kind=kind, data=redacted, created_at=now)
        for (run_id, seq), redacted in zip(seqs.items(), datas, strict=True)
    )

    def ring_each() -> None:
        for run_id, seq in seqs.items():
            ring(run_id, seq)

    transaction.on_commit(ring_each)
    return seqs


def group_name(run_id: int) -> str:
    return f"run.{run_id}"


def fleet_group(user_id: int) -> str:
    """The group of `user_id`'s fleet sockets: a doorbell wakes only the fleet pages of the run's owner."""
    return f"fleet.{user_id}"


@functools.lru_cache(maxsize=65536)
def _owner_of(run_id: int) -> int | None:
    return Run.objects.filter(pk=run_id).values_list("owner_id", flat=True).first()  # a run's owner never changes


def ring(run_id: int, seq: int) -> None:
    """Wake viewers of `run_id` and its owner's fleet pages; they read the events themselves from the database.

    Only with REDIS_URL (on the embedded default viewers tail the events table). The send
    happens on this process's doorbell thread, off the caller's path.
    """
    if settings.REDIS_URL:
        _doorbell.get().ring(run_id, seq, _owner_of(run_id))


class Doorbell:
    """One event loop per process that sends doorbells over the channel layer.

    A long-lived loop keeps the channel layer's Redis connections open; ringing from a
    worker thread costs a queue put, not a connection.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tether-doorbell", daemon=True).start()

    def ring(self, run_id: int, seq: int, owner_id: int | None) -> None:
        asyncio.run_coroutine_threadsafe(self._send(run_id, seq, owner_id), self.loop)

    async def _send(self, run_id: int, seq: int, owner_id: int | None) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        message = {"type": "run.doorbell", "run": run_id, "seq": seq}
        try:
            await layer.group_send(group_name(run_id), message)
            if owner_id is not None:
                await layer.group_send(fleet_group(owner_id), message)
        except Exception:  # a missed doorbell only delays viewers until their next poll
            log.warning("doorbell for run %s failed", run_id, exc_info=True)


_doorbell = PerProcess(Doorbell)


def after(run: Run, seq: int, limit: int = 1000) -> list[Event]:
    """Return the run's events with seq > `seq`, oldest first."""
    return list(Event.objects.filter(run=run, seq__gt=seq).order_by("seq")[:limit])
