"""Text the run's records can hold: PostgreSQL's text and JSON cannot hold a NUL.

A program or a model may print or write one (its output, its reply, its tool calls, a decider's
answer that spells one as `\\u0000`); U+FFFD stands in for it. Pure: the loop's pure modules use it.
"""

from __future__ import annotations

from typing import Any


def storable(value: Any) -> Any:
    """Return `value` (text, or lists and objects of it) with every NUL replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    return value
