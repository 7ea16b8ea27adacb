"""The journal of tool calls: what a Claude-brain act ran, so a re-run never runs it twice.

Every tool call of an act (built-in, MCP, or approved by a person) gets an idempotency key,
run, iteration, turn and call index ("r12-i3-t2-c0"), and a `ToolCall` row committed before
the call runs; its result is written after. When a worker dies mid-act, the iteration's next
attempt replays the journal: the model's answers come back verbatim, finished calls give
their recorded results without running again, and a call started but never finished is
reported to the model as interrupted (its effect unknown) instead of being repeated.

Runs in the worker, outside any transaction: each write is its own short transaction,
retried through transient database faults (`tether.dbfaults`); a write that fails for good
raises `JournalError`, and the brain then fails the act without running the call. The
(run, iteration, turn, index) constraint makes a second start of one key impossible.

No key is stored in the clear (`tether.redaction`, the redactor events use): a call's name,
input and result are stored redacted (the result is what the model was sent already). The model's
answer of a turn is stored redacted too, for reading; a replay must give it back verbatim, though
(the model is sent its own earlier answer, and a call of it that never started runs now, with the
input the model gave), so when redaction changed it the exact answer is kept beside, encrypted
like a stored credential: `{"redacted": [...], "encrypted": token}` instead of the list. A replay
whose copy no configured secret opens (the secret key was rotated and its fallback dropped) gives
the redacted answer back.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from instances import credentials
from instances.brains.base import JournaledCall, JournaledTurn, JournalError
from loops.models import ToolCall
from tether import dbfaults
from tether.redaction import redact_data
from tether.storable import storable


def key_of(run_id: int, iteration: int, turn: int, index: int) -> str:
    return f"r{run_id}-i{iteration}-t{turn}-c{index}"


class ToolJournal:
    """The journal of one iteration of one run, as one attempt of it writes and replays it."""

    def __init__(self, run_id: int, iteration: int, attempt: int) -> None:
        self.run_id = run_id
        self.iteration = iteration
        self.attempt = max(attempt, 1)
        self._rows: dict[str, int] = {}  # key -> row id, for `finished`
        self._turns_kept: set[int] = set()  # turns whose model answer is journaled already

    def replay(self) -> dict[int, JournaledTurn]:
        """Return what earlier attempts journaled for this iteration, by turn."""
        try:
            rows = dbfaults.retry(
                lambda: list(ToolCall.objects.filter(run_id=self.run_id, iteration=self.iteration).order_by("turn", "index")),
                what=f"run {self.run_id}: read the tool journal",
            )
        except Exception as exc:  # noqa: BLE001 - without the journal a re-run could repeat a call
            raise JournalError(f"the tool journal could not be read ({type(exc).__name__})") from None
        turns: dict[int, JournaledTurn] = {}
        for row in rows:
            turn = turns.setdefault(row.turn, JournaledTurn(row.turn, None))
            if row.turn_content is not None and turn.content is None:
                turn.content = opened(row.turn_content)
            turn.calls[row.index] = JournaledCall(
                row.key, row.finished_at is not None, row.result, bool(row.is_error)
            )
            self._rows[row.key] = row.pk
        self._turns_kept |= {t for t, turn in turns.items() if turn.content is not None}
        return turns

    def started(
        self, turn: int, index: int, call: dict[str, Any], turn_content: list[dict[str, Any]] | None
    ) -> str:
        """Commit the call as started (with the turn's model answer if not kept yet); return its key."""
        key = key_of(self.run_id, self.iteration, turn, index)
        content = turn_content if turn not in self._turns_kept else None
        tries = 0

        def once() -> int:
            nonlocal tries
            tries += 1
            if tries > 1:  # the connection died; maybe after the insert had committed
                found = ToolCall.objects.filter(
                    run_id=self.run_id, iteration=self.iteration, turn=turn, index=index, attempt=self.attempt
                ).values_list("pk", flat=True).first()
                if found is not None:
                    return found
            with transaction.atomic():  # (redacted in here: the connection is open, the stored keys current)
                return ToolCall.objects.create(
                    run_id=self.run_id,
                    iteration=self.iteration,
                    turn=turn,
                    index=index,
                    attempt=self.attempt,
                    name=stored(str(call.get("name", "")))[:200],
                    call=stored(call),
                    turn_content=None if content is None else sealed(content),
                    started_at=timezone.now(),
                ).pk

        try:
            self._rows[key] = dbfaults.retry(once, what=f"run {self.run_id}: journal {key}")
        except IntegrityError:
            raise JournalError(f"tool call {key} was journaled by another attempt already; not running it") from None
        except Exception as exc:  # noqa: BLE001 - any failed write: the call must not run unjournaled
            raise JournalError(f"the tool journal could not record {key} ({type(exc).__name__})") from None
        if content is not None:
            self._turns_kept.add(turn)
        return key

    def finished(self, key: str, result: str, is_error: bool) -> None:
        """Record the call's result."""
        row = self._rows.get(key)
        if row is None:
            raise JournalError(f"tool call {key} was never journaled as started")

        def once() -> None:
            ToolCall.objects.filter(pk=row).update(result=stored(result), is_error=is_error, finished_at=timezone.now())

        try:
            dbfaults.retry(once, what=f"run {self.run_id}: journal {key}'s result")
        except Exception as exc:  # noqa: BLE001 - the act cannot go on with a journal that lies
            raise JournalError(f"the tool journal could not record the result of {key} ({type(exc).__name__})") from None


def stored(value: Any) -> Any:
    """Return what the journal stores of a call's name, input or result: redacted, and with no NUL.

    A model may write a NUL into a call (PostgreSQL's text and JSON cannot hold one): U+FFFD stands
    in for it, as in the run's other records.
    """
    return storable(redact_data(value))


def sealed(content: list[dict[str, Any]]) -> Any:
    """Return a model's answer as it is stored: `stored`, with the exact answer encrypted if they differ."""
    kept = stored(content)
    if kept == content:
        return content
    return {"redacted": kept, "encrypted": credentials.encrypt(json.dumps(content))}


def opened(stored: Any) -> list[dict[str, Any]]:
    """Return the model's answer from what `sealed` stored: the exact one if it can be decrypted."""
    if not isinstance(stored, dict):
        return list(stored)
    try:
        return json.loads(credentials.decrypt(stored["encrypted"]))
    except credentials.CredentialUnreadable:
        return list(stored["redacted"])


def calls_of(run_id: int, iteration: int) -> list[dict[str, Any]]:
    """Return the journaled tool calls of one iteration: name, key, state (started/finished), is_error."""
    rows = ToolCall.objects.filter(run_id=run_id, iteration=iteration).order_by("turn", "index")
    return [
        {
            "name": row.name,
            "key": row.key,
            "state": "finished" if row.finished_at is not None else "started",
            "is_error": bool(row.is_error),
            "attempt": row.attempt,
        }
        for row in rows
    ]
