"""Structured logs: one JSON object per line, for log shippers.

Selected with TETHER_LOG_FORMAT=json. Each line carries the time (UTC, ISO 8601),
level, logger, message and, when the call passed them in `extra`, the run and
iteration it is about (`extra={"run_id": 42, "iteration": 3}`) and the worker.
An exception is rendered into `exc` as one string, so a line stays one line.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# Record attributes copied into the line when a log call set them through `extra`.
CONTEXT_FIELDS = ("run_id", "iteration", "worker", "reservation_id", "pool_id")


class JsonFormatter(logging.Formatter):
    """Format a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)
