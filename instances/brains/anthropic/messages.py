"""The shapes of a Messages request and answer the brain builds and reads. Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from instances.brains.anthropic.config import CACHE
from instances.brains.text import clip


def with_cache_marker(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return messages with a cache breakpoint on the last block of the last (user) message.

    Only that message is copied; the assistant turns are sent exactly as received.
    """
    if not messages or messages[-1]["role"] != "user":
        return messages
    last = messages[-1]
    content = last["content"]
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    )
    blocks[-1]["cache_control"] = CACHE
    return [*messages[:-1], {"role": "user", "content": blocks}]


def texts(content: Iterable[Mapping[str, Any]]) -> str:
    return "\n".join(str(b.get("text", "")) for b in content if b.get("type") == "text" and b.get("text"))


def brief_input(value: Any, limit: int = 300) -> Any:
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, Mapping):
        return {k: brief_input(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [brief_input(v, limit) for v in value[:20]]
    return value


def call_signature(name: str, arguments: Any) -> str:
    """Return a stable text naming one tool call, to match an approval to a call."""
    return f"{name} {json.dumps(arguments, sort_keys=True, separators=(',', ':'))}"
