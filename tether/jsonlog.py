"""Structured logs: one JSON object per line, for log shippers.

Selected with TETHER_LOG_FORMAT=json. Each line carries the time (UTC, ISO 8601),
level, logger, message and the run and iteration it is about, with the worker:
from the call's `extra` (`extra={"run_id": 42, "iteration": 3}`), else from what the
current thread (or task) bound with `bind(run_id=..., iteration=...)` — a driver thread
binds its run once, and every line logged while it drives it says which run it is.
An exception is rendered into `exc` as one string, so a line stays one line.

Both formatters here (`JsonFormatter`, and `PlainFormatter` for the default text lines) redact
every line (`tether.redaction`): a key that reached a message or a traceback is not logged.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

from tether.redaction import redact

# Record attributes copied into the line when a log call set them through `extra`.
CONTEXT_FIELDS = ("run_id", "iteration", "worker", "reservation_id", "pool_id")

_bound: ContextVar[dict[str, Any]] = ContextVar("tether_log_context", default={})  # noqa: B039 (never mutated)


def bind(**fields: Any) -> Token[dict[str, Any]]:
    """Attach `fields` (of CONTEXT_FIELDS) to every line this thread or task logs from now on.

    Return a token for `restore`, which puts back what was bound before.
    """
    unknown = set(fields) - set(CONTEXT_FIELDS)
    if unknown:
        raise ValueError(f"unknown log context field(s): {', '.join(sorted(unknown))}")
    return _bound.set({**_bound.get(), **fields})


def restore(token: Token[dict[str, Any]]) -> None:
    """Put back what was bound before the `bind` that returned `token`."""
    _bound.reset(token)


def unbind() -> None:
    """Forget what this thread or task bound."""
    _bound.set({})


def bound() -> dict[str, Any]:
    return dict(_bound.get())


class JsonFormatter(logging.Formatter):
    """Format a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
            "process": record.process,
            "thread": record.threadName,
        }
        context = _bound.get()
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = context.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exc"] = redact(record.exc_text)
        if record.stack_info:
            line["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(line, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """Format a record as text (`logging.Formatter`), redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))
