"""The LLM rubric judge: an independent Claude prompt that grades a run's final result.

Runs in the worker, outside any transaction; makes one model call (with the brain's bounded
retries) through `instances.brains.anthropic.session.Session`, so it uses the instance's own key and
endpoint and never reads the environment's. The judge is separate from the actor: its own
system prompt, no tools, none of the actor's conversation — only the objective, the acceptance
criteria, the final answer, the latest check results and the workspace diff. It answers
`pass`, `fail` or `needs-human` with reasons. Anything it cannot say clearly, and any error
reaching it, is `needs-human`: a judgment nobody could make goes to a person.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from instances.brains.anthropic.config import model_for
from instances.brains.base import BrainError, Usage

VERDICTS = ("pass", "fail", "needs-human")
ANSWER_CHARS = 12_000
DIFF_CHARS = 12_000
CHECK_OUTPUT_CHARS = 1_500

JUDGE_PROMPT = """You are an independent reviewer of work done by an autonomous agent run by Tether.
You did not do the work and you owe the agent nothing. You receive the objective, its acceptance
criteria, the agent's final answer, the latest results of the machine checks and the changes the
agent made to its workspace. Grade the final result against the acceptance criteria:

- "pass": every criterion is met, and the evidence shown (the answer, the diff, the checks) proves it;
- "fail": a criterion is not met, or the answer claims something the evidence contradicts;
- "needs-human": meeting the criteria is a judgment call you cannot make from this evidence.

A confident, well-formatted answer is not evidence. An agent that says it changed something the diff
does not show has not done it. Give short, specific reasons. Answer by calling the record_grade tool
once. If you cannot call it, answer with only a JSON object: {"verdict": "...", "reasons": ["..."], "score": 0-100}."""
GRADE_TOOL = {
    "name": "record_grade",
    "description": "Record the grade of the agent's final result, with the reasons.",
    "input_schema": {
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": list(VERDICTS)},
            "reasons": {"type": "array", "items": {"type": "string"}, "description": "one line each"},
            "score": {
                "type": "integer", "minimum": 0, "maximum": 100,
                "description": "how fully the acceptance criteria are met, 0 (not at all) to 100 (entirely)",
            },
        },
        "required": ["verdict", "reasons"],
    },
}


@dataclass
class Verdict:
    """The judge's grade of a final result."""

    verdict: str  # one of VERDICTS
    reasons: list[str]
    usage: Usage = field(default_factory=Usage)
    error: str = ""  # set when the judge could not grade (then verdict is needs-human)
    score: int | None = None  # 0-100, when the judge gave one

    def as_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": self.reasons, "error": self.error or None, "score": self.score}


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]}\n…[{len(text) - limit} characters omitted]…\n{text[-(limit - head):]}"


def render_prompt(*, objective: str, criteria: str, answer: str, checks: Sequence[Any], diff: str) -> str:
    """Return the judge's one user message (pure)."""
    parts = [f"# Objective\n{objective.strip()}"]
    parts.append(
        "# Acceptance criteria\n"
        + (criteria.strip() or "(none given beyond the objective: the objective must be fully achieved)")
    )
    parts.append(f"# The agent's final answer\n{_clip(answer.strip(), ANSWER_CHARS) or '(empty)'}")
    if checks:
        lines = []
        for check in checks:
            state = "passed" if check.passed else "FAILED"
            kind = "required" if check.required else "optional"
            line = f"- {check.name} ({kind}): {state}"
            if not check.passed and check.output:
                line += "\n" + _clip(check.output, CHECK_OUTPUT_CHARS)
            lines.append(line)
        parts.append("# Machine checks, run after the final act\n" + "\n".join(lines))
    else:
        parts.append("# Machine checks\n(none configured)")
    parts.append(f"# Changes to the workspace since the run started\n{_clip(diff.strip(), DIFF_CHARS) or '(none)'}")
    return "\n\n".join(parts)


def read_score(content: Sequence[dict[str, Any]]) -> int | None:
    """Return the judge's score (0-100) from its response content, or None when it gave none."""
    found = _answer(content)
    score = found.get("score") if isinstance(found, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 100:
        return None
    return int(score)


def passes(verdict: str, score: int | None, threshold: int) -> tuple[str, list[str]]:
    """Return the verdict a pass threshold leaves (a pass scored below it fails), and the reason it adds (pure)."""
    if verdict != "pass" or not threshold or (score is not None and score >= threshold):
        return verdict, []
    said = "gave no score" if score is None else f"scored it {score}"
    return "fail", [f"the judge {said}, below the pass threshold of {threshold}"]


def _answer(content: Sequence[dict[str, Any]]) -> Any:
    found: Any = None
    for block in content:
        if block.get("type") == "tool_use" and block.get("name") == GRADE_TOOL["name"]:
            found = block.get("input")
            break
    if found is None:
        text = "\n".join(str(b.get("text", "")) for b in content if b.get("type") == "text").strip()
        start, end = text.find("{"), text.rfind("}")
        if start == -1 or end <= start:
            return None
        try:
            found = json.loads(text[start : end + 1])
        except ValueError:
            return None
    return found


def read_answer(content: Sequence[dict[str, Any]]) -> tuple[str, list[str]] | None:
    """Return (verdict, reasons) from the judge's response content, or None if it says neither clearly."""
    found = _answer(content)
    if not isinstance(found, dict):
        return None
    verdict = str(found.get("verdict", "")).strip().lower().replace("_", "-").replace(" ", "-")
    if verdict not in VERDICTS:
        return None
    reasons = found.get("reasons")
    if isinstance(reasons, str):
        reasons = [reasons]
    if not isinstance(reasons, list):
        reasons = []
    return verdict, [str(r).strip()[:1000] for r in reasons if str(r).strip()][:20]


def judge(
    instance: Any,
    *,
    objective: str,
    criteria: str,
    answer: str,
    checks: Sequence[Any],
    diff: str,
    model: str = "",
    pass_threshold: int = 0,
    stop: threading.Event | None = None,
    meter: Any = None,
) -> Verdict:
    """Ask the judge to grade a final result; never raises for a provider or key problem.

    With `pass_threshold` (1-100) a pass needs the judge's score to reach it, else it is a fail.
    """
    from instances.brains.anthropic.session import Session  # lazy: only a judged run needs the SDK

    timeout = float(settings.TETHER_JUDGE_TIMEOUT_SECONDS)
    try:
        session = Session(
            instance,
            stop=stop or threading.Event(),
            deadline=time.monotonic() + timeout,
            model=model or model_for(instance),
            meter=meter,
        )
    except BrainError as exc:
        return Verdict("needs-human", [], exc.usage, f"the judge could not run: {exc.detail}")
    params = {
        "model": session.usage.model,
        "max_tokens": 1024,
        "system": [{"type": "text", "text": JUDGE_PROMPT}],
        "tools": [GRADE_TOOL],
        "tool_choice": {"type": "tool", "name": GRADE_TOOL["name"]},
        "messages": [
            {
                "role": "user",
                "content": render_prompt(objective=objective, criteria=criteria, answer=answer, checks=checks, diff=diff),
            }
        ],
    }
    try:
        body = session.create(params)
    except BrainError as exc:
        return Verdict("needs-human", [], exc.usage, f"the judge could not run: {session.scrub(exc.detail)}")
    except Exception as exc:  # stopped or timed out inside the session
        return Verdict("needs-human", [], session.usage, f"the judge did not answer ({type(exc).__name__.strip('_')})")
    finally:
        session.close()
    read = read_answer(body.get("content") or [])
    if read is None:
        return Verdict("needs-human", [], session.usage, "the judge's answer could not be read")
    said, reasons = read
    score = read_score(body.get("content") or [])
    verdict, below = passes(said, score, pass_threshold)
    return Verdict(verdict, [session.scrub(r) for r in reasons] + below, session.usage, score=score)
