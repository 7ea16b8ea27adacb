"""The `llm` decider: Claude judges a finished iteration through an optional `record_decision` tool."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from instances.brains.anthropic.config import CACHE, model_for
from instances.brains.anthropic.messages import texts
from instances.brains.anthropic.session import Session, Stopped, TimedOut
from instances.brains.base import Meter, ProviderError, Usage
from instances.brains.text import clip, render_checks

DECIDER_PROMPT = """You are the judge of an autonomous agent loop run by Tether.
After each iteration you see the objective, what the agent was told and answered, the results of the
machine checks, and a summary of earlier iterations. Decide what happens next:

- "done": the objective is met and the evidence (fresh check results, the agent's account) shows it;
- "continue": progress is possible; give the precise next instruction for the agent;
- "escalate": a person is needed (missing information, a decision, access the agent lacks);
- "failed": the objective cannot be reached (impossible, or the same failure repeats without progress).

Never call a run done while a required check fails. Prefer a different next instruction to repeating one
that did not work. Answer by calling the record_decision tool once. If you cannot call it, answer with only
a JSON object: {"verdict": "...", "reason": "...", "next_instruction": "..."}."""
DECISION_TOOL = {
    "name": "record_decision",
    "description": "Record the verdict on the iteration just finished, the reason, and the next instruction.",
    "input_schema": {
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["continue", "done", "escalate", "failed"]},
            "reason": {"type": "string", "description": "one or two sentences of evidence"},
            "next_instruction": {"type": "string", "description": "what the agent does next (for continue)"},
        },
        "required": ["verdict", "reason"],
    },
}


def render_decider_prompt(snapshot: Mapping[str, Any]) -> str:
    """Return the decider's view of a finished iteration as text. Pure.

    The snapshot's `history` is the earlier iterations already compacted (`loops.compaction`).
    """
    parts = [f"Objective:\n{clip(str(snapshot.get('objective') or ''), 6000)}"]
    if (history := snapshot.get("history")) and isinstance(history, str):
        parts.append(history)
    iteration, most = snapshot.get("iteration"), snapshot.get("max_iterations")
    if iteration:
        parts.append(f"This was iteration {iteration}" + (f" of at most {most}." if most else "."))
    if instruction := snapshot.get("instruction"):
        parts.append(f"The agent was told:\n{clip(str(instruction), 3000)}")
    act = "succeeded" if snapshot.get("act_ok", True) else "failed"
    detail = str(snapshot.get("act_detail") or "")
    parts.append(f"The act {act}." + (f" ({clip(detail, 500)})" if detail else ""))
    if response := snapshot.get("response"):
        parts.append(f"The agent answered:\n{clip(str(response), 4000)}")
    checks = render_checks(snapshot.get("checks") or [])
    parts.append(checks or "No machine checks are configured; judge from the agent's account.")
    parts.append("Decide now with record_decision.")
    return "\n\n".join(parts)


def decide(
    instance: Any,
    snapshot: dict[str, Any],
    *,
    stop: threading.Event | None = None,
    timeout: float | None = None,
    meter: Meter | None = None,
) -> tuple[str, Usage]:
    """Ask Claude to judge an iteration; return its raw answer text and the usage of the call(s).

    The snapshot's `history`, when there is one, is the earlier iterations as text, compacted by
    the caller (`loops.compaction.for_prompt`).
    """
    session = Session(
        instance,
        stop=stop or threading.Event(),
        deadline=time.monotonic() + (timeout or float(instance.act_timeout_seconds)),
        model=model_for(instance),
        meter=meter,
    )
    params = {
        "model": session.usage.model,
        "max_tokens": 1024,
        "system": [{"type": "text", "text": DECIDER_PROMPT, "cache_control": CACHE}],
        "tools": [DECISION_TOOL],
        "tool_choice": {"type": "auto"},
        "messages": [
            {
                "role": "user",
                "content": render_decider_prompt(snapshot),
            }
        ],
    }
    try:
        body = session.create(params)
    except Stopped:
        raise ProviderError("the decision was stopped before Claude answered", session.usage) from None
    except TimedOut:
        raise ProviderError("the decision timed out", session.usage) from None
    finally:
        session.close()
    content = body.get("content") or []
    for block in content:
        if block.get("type") == "tool_use" and block.get("name") == DECISION_TOOL["name"]:
            return session.scrub(json.dumps(block.get("input") or {})), session.usage
    return session.scrub(texts(content)), session.usage
