"""Text for a model's prompt, provider-neutral and pure: lengths, clipping, check results.

Shared by the Claude brain (`instances.brains.anthropic`) and the history's compaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def estimate_tokens(text: str) -> int:
    """Return a rough token count (four characters a token)."""
    return math.ceil(len(text) / 4)


def clip(text: str, limit: int) -> str:
    """Return `text` cut to about `limit` characters, keeping its head and its tail."""
    text = text or ""
    if len(text) <= limit:
        return text
    if limit < 40:
        return text[:limit]
    head = limit // 3
    tail = limit - head - 20
    return f"{text[:head]} …[{len(text) - head - tail} chars]… {text[-tail:]}"


def read_checks(value: Any) -> list[tuple[str, bool | None, str]]:
    """Normalise check results given as {name: passed} or [{name, passed|ok|status, output}]."""
    found: list[tuple[str, bool | None, str]] = []
    if isinstance(value, Mapping):
        for name, passed in value.items():
            found.append((str(name), passed if isinstance(passed, bool) else None, ""))
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, Mapping):
                continue
            passed = item.get("passed", item.get("ok"))
            if passed is None and "status" in item:
                passed = item["status"] in ("passed", "pass", "ok", True)
            output = item.get("output") or item.get("detail") or ""
            found.append((str(item.get("name", "?")), passed if isinstance(passed, bool) else None, str(output)))
    return found


def render_checks(checks: Iterable[Mapping[str, Any]]) -> str:
    lines = []
    for name, ok, output in read_checks(list(checks)):
        state = "passed" if ok else "FAILED" if ok is False else "unknown"
        lines.append(f"- {name}: {state}" + (f"\n{clip(output, 1500)}" if output and not ok else ""))
    return "Latest check results:\n" + "\n".join(lines) if lines else ""
