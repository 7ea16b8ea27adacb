"""Read a decider's answer and turn check results into a decision.

Pure: no Django, no clock, no I/O. `parse` reads what the `llm` decider said (a JSON object,
fenced JSON, JSON inside prose, or plain prose) into a `Decision`; anything it cannot read
safely becomes `escalate` (a human is needed), never a silent `done`. Obvious self-repetition
(an instruction already given twice, or an answer that repeats one line over and over) becomes
`failed`. `from_checks` is the `checks` decider, and `backpressure` is the deterministic text
that tells the agent which checks fail: the same failures always give the same text, which is
what lets the policy's no-progress rule notice a loop that is not moving.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tether.storable import storable

if TYPE_CHECKING:
    from loops.policy import Check

Verdict = Literal["continue", "done", "escalate", "failed"]
VERDICTS: tuple[Verdict, ...] = ("continue", "done", "escalate", "failed")
_BY_NAME: dict[str, Verdict] = {verdict: verdict for verdict in VERDICTS}

MAX_REASON_CHARS = 2_000
MAX_INSTRUCTION_CHARS = 8_000
# Check output fed back to the agent: the tail of each failing check, and a total budget.
CHECK_OUTPUT_CHARS = 2_000
CHECKS_OUTPUT_TOTAL_CHARS = 6_000
# A failed act's detail fed back to the agent (its exit status and the tail of its stderr).
ACT_DETAIL_CHARS = 2_000
MAX_LISTED_CHECKS = 20
# An instruction proposed this many times before is the agent going round in circles.
REPEATS_BEFORE_FAILED = 2
# A line or sentence repeated this many times, making up at least half the answer, is degenerate.
DEGENERATE_REPEATS = 5
# Bounds on the work done reading one answer: its head and tail, a number of '{' positions tried
# when looking for JSON inside prose, and the window searched for a repeated phrase.
_ANSWER_HEAD_TAIL_CHARS = 50_000
_MAX_JSON_ATTEMPTS = 200
_PERIOD_WINDOW = 20_000

_TRUNCATED = " [...truncated]"
_UNDERSTOOD = "the decider's answer could not be understood"


@dataclass(frozen=True)
class Decision:
    """What a decider proposes after an act."""

    verdict: Verdict
    reason: str
    next_instruction: str = ""


# -- normalising -------------------------------------------------------------------------------

_NOT_WORD = re.compile(r"[\W_]+")
_FILLER = frozenset(
    {"please", "pls", "kindly", "thanks", "thank", "you", "ok", "okay", "now", "again", "then", "so"}
)


def normalise(instruction: str) -> str:
    """Return `instruction` reduced so that trivially re-worded repeats compare equal.

    Lower-cases, drops punctuation (numbers stay), collapses whitespace and strips filler words
    ("please", "now", "again", "thanks", ...) from both ends.
    """
    text = unicodedata.normalize("NFKC", instruction).casefold()
    words = _NOT_WORD.sub(" ", text).split()
    while words and words[0] in _FILLER:
        words.pop(0)
    while words and words[-1] in _FILLER:
        words.pop()
    return " ".join(words)


def _verdict_words(value: str) -> str:
    return " ".join(_NOT_WORD.sub(" ", unicodedata.normalize("NFKC", value).casefold()).split())


# -- verdict vocabulary ------------------------------------------------------------------------

# Values a structured answer (or a whole one-word answer) may give for the verdict.
# Phrases separated by '|'.
_ALIAS_PHRASES: dict[Verdict, str] = {
    "done": (
        "done|complete|completed|finished|finish|success|successful|succeeded|solved|resolved|"
        "accomplished|achieved|all done|task complete|task completed|objective complete|"
        "objective completed|objective met|objective achieved"
    ),
    "failed": (
        "failed|fail|failure|fails|giveup|give up|giving up|gave up|abort|aborted|impossible|"
        "unachievable|abandon|abandoned|cannot complete|can not complete|cannot be done|"
        "not possible"
    ),
    "escalate": (
        "escalate|escalated|escalating|escalation|human|ask|help|blocked|question|clarify|review|"
        "needs human|need human|needs a human|need a human|human needed|human required|ask human|"
        "ask a human|ask user|ask the user|need help|needs help|needs input|need input|"
        "needs clarification|need clarification|human input|human review|needs review"
    ),
    "continue": (
        "continue|continuing|next|retry|proceed|working|incomplete|iterate|again|todo|unfinished|"
        "keep going|go on|in progress|not done|not yet done|not finished|not complete|"
        "not completed|more work|more work needed|try again|next step|next iteration"
    ),
}
_ALIASES: dict[str, Verdict] = {
    phrase: verdict for verdict, phrases in _ALIAS_PHRASES.items() for phrase in phrases.split("|")
}

# Words that count as a verdict when they appear anywhere in prose. Stricter than `_ALIASES`:
# "next", "ask", "help", "failed" are everyday words in an answer and say nothing on their own.
# Order matters: negations come first so "not done" is read as one phrase, not as "done".
_PROSE = re.compile(
    r"""
    (?P<continue>
        \b(?:not|isn't|aren't|wasn't|isn’t|aren’t|wasn’t)\s+(?:yet\s+)?(?:done|complete|completed|finished)\b
      | \bnot\s+yet\b
      | \b(?:continue|continuing|retry|incomplete|unfinished|keep\s+going)\b
      | \bmore\s+work\s+(?:is\s+)?(?:needed|required)\b
    )
  | (?P<failed>
        \b(?:give|giving|gave)\s+up\b
      | \b(?:impossible|unachievable)\b
      | \bcannot\s+be\s+(?:done|completed|achieved|fixed)\b
    )
  | (?P<escalate>
        \bescalat(?:e|ed|es|ing|ion)\b
      | \bneeds?\s+(?:a\s+)?(?:human|person|clarification)\b
      | \bhuman\s+(?:input|review|help|decision|attention|needed|required)\b
    )
  | (?P<done>
        \b(?:done|complete|completed|finished|accomplished)\b
    )
    """,
    re.IGNORECASE | re.VERBOSE,
)
# "verdict: done", "**Status**: continue", '"decision" = "escalate"'.
_LABELLED_VERDICT = re.compile(
    r"""(?:^|[\s{,"'*_#>(])(?:verdict|decision|status)["'*_`]*\s*[:=]\s*["'*_`]*\s*
        ([a-z][a-z \t_\-'’]{0,40})""",
    re.IGNORECASE | re.VERBOSE | re.MULTILINE,
)
_LABELS = (
    r"verdict|decision|status|reason|why|rationale"
    r"|next[ _-]?instruction|next[ _-]?step|next[ _-]?action|next|instruction"
)
_LABEL_LINE = re.compile(rf"^[\s*_#>\-]*(?P<label>{_LABELS})[*_]*\s*[:=]\s*", re.IGNORECASE | re.MULTILINE)


def _prose_verdicts(text: str) -> set[Verdict]:
    return {_BY_NAME[match.lastgroup or ""] for match in _PROSE.finditer(text)}


def _verdict_of(value: str) -> Verdict | None:
    """Return the verdict a single value names, or None when it names none or several."""
    words = _verdict_words(value)
    if words in _ALIASES:
        return _ALIASES[words]
    parts = words.split()
    for size in (3, 2, 1):
        if len(parts) > size and " ".join(parts[:size]) in _ALIASES:
            return _ALIASES[" ".join(parts[:size])]
    found = _prose_verdicts(value)
    if len(found) == 1:
        return next(iter(found))
    return None


# -- degenerate answers ------------------------------------------------------------------------

_UNITS = re.compile(r"\n|(?<=[.!?])\s+")


def is_degenerate(text: str) -> bool:
    """Return True if `text` is the same line, sentence or phrase repeated over and over."""
    units = [unit for unit in (normalise(u) for u in _UNITS.split(text)) if unit]
    if len(units) >= DEGENERATE_REPEATS:
        top = Counter(units).most_common(1)[0][1]
        if top >= DEGENERATE_REPEATS and top * 2 >= len(units):
            return True
    # One phrase repeated without any line or sentence breaks: "fix it fix it fix it ...".
    # A long enough prefix decides it: the rest of a periodic text is periodic too.
    flat = " ".join(text[:_PERIOD_WINDOW].casefold().split())
    if len(flat) < 20:
        return False
    # "ab ab ab" repeats "ab " once a separator closes the last repetition; "ababab" repeats as is.
    return any(len(s) >= DEGENERATE_REPEATS * (len(s) - _border(s)) for s in (flat, flat + " "))


def _border(text: str) -> int:
    """Return the length of the longest proper prefix of `text` that is also its suffix."""
    table = [0] * len(text)
    k = 0
    for i in range(1, len(text)):
        while k and text[i] != text[k]:
            k = table[k - 1]
        if text[i] == text[k]:
            k += 1
        table[i] = k
    return table[-1] if table else 0


# -- structured answers ------------------------------------------------------------------------

_VERDICT_KEYS = ("verdict", "decision", "status", "action")
_REASON_KEYS = ("reason", "why", "rationale", "explanation")
_INSTRUCTION_KEYS = ("next_instruction", "next", "instruction", "next_step", "next_action")
_FENCE = re.compile(
    r"```[ \t]*(?:json|jsonc|json5|javascript|js)?[ \t]*\r?\n?(.*?)```", re.IGNORECASE | re.DOTALL
)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _key(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", _CAMEL.sub("_", name.strip())).casefold()


def _loads(text: str) -> object:
    for candidate in (text, _TRAILING_COMMA.sub(r"\1", text)):
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            continue
    return None


def _as_decision_object(value: object, depth: int = 0) -> dict[str, object] | None:
    """Return `value` as a dict with normalised keys if it carries a verdict, else None.

    Accepts the decision wrapped once or twice: {"decision": {"verdict": ...}}.
    """
    if not isinstance(value, Mapping):
        return None
    obj = {_key(str(k)): v for k, v in value.items()}
    for key in _VERDICT_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and depth < 2:
            nested = _as_decision_object(inner, depth + 1)
            if nested is not None:
                return nested
    if any(isinstance(obj.get(key), str) for key in _VERDICT_KEYS):
        return obj
    return None


def _json_objects(text: str) -> tuple[list[dict[str, object]], str]:
    """Return the decision objects found in `text` and the prose left around them."""
    stripped = text.strip()
    whole = _as_decision_object(_loads(stripped)) if stripped[:1] == "{" else None
    if whole is not None:
        return [whole], ""
    found: list[dict[str, object]] = []
    spans: list[tuple[int, int]] = []
    for fence in _FENCE.finditer(text):
        obj = _as_decision_object(_loads(fence.group(1).strip()))
        if obj is not None:
            found.append(obj)
            spans.append(fence.span())
    if not found:
        decoder = json.JSONDecoder()
        position, attempts = text.find("{"), 0
        while position != -1 and attempts < _MAX_JSON_ATTEMPTS:
            attempts += 1
            try:
                value, end = decoder.raw_decode(text, position)
            except (ValueError, RecursionError):
                position = text.find("{", position + 1)
                continue
            obj = _as_decision_object(value)
            if obj is not None:
                found.append(obj)
                spans.append((position, end))
            position = text.find("{", end)
    prose, last = [], 0
    for start, end in spans:
        prose.append(text[last:start])
        last = end
    prose.append(text[last:])
    return found, "\n".join(prose)


def _text_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "\n".join(item.strip() for item in value).strip()
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _first(obj: Mapping[str, object], keys: Sequence[str]) -> str:
    for key in keys:
        if key in obj:
            text = _text_value(obj[key])
            if text:
                return text
    return ""


def _object_verdict(obj: Mapping[str, object]) -> tuple[Verdict | None, str]:
    """Return the object's verdict, or None with the reason it has none."""
    named = [obj[key] for key in _VERDICT_KEYS if isinstance(obj.get(key), str)]
    verdicts = {_verdict_of(str(value)) for value in named}
    known = verdicts - {None}
    if len(known) > 1:
        return None, "it gives contradictory verdicts (" + ", ".join(sorted(str(v) for v in known)) + ")"
    if len(known) == 1:
        return known.pop(), ""
    shown = ", ".join(repr(_cap(str(value), 40)) for value in named)
    return None, f"it names no known verdict ({shown})"


def _from_objects(objects: list[dict[str, object]]) -> Decision:
    verdicts: set[Verdict] = set()
    for obj in objects:
        verdict, problem = _object_verdict(obj)
        if verdict is None:
            return _escalate(problem)
        verdicts.add(verdict)
    if len(verdicts) > 1:
        return _escalate("it gives contradictory verdicts (" + ", ".join(sorted(verdicts)) + ")")
    last = objects[-1]
    return _decision(verdicts.pop(), _first(last, _REASON_KEYS), _first(last, _INSTRUCTION_KEYS))


# -- prose answers -----------------------------------------------------------------------------


def _labelled(text: str) -> dict[str, str]:
    """Return the text after each "label:" line (reason, next instruction, ...), up to the next label."""
    marks = list(_LABEL_LINE.finditer(text))
    sections: dict[str, str] = {}
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
        label = _key(mark.group("label"))
        body = text[mark.end() : end].strip()
        if body and label not in sections:
            sections[label] = body
    return sections


def _from_prose(text: str) -> Decision:
    labelled = {verdict for verdict in map(_verdict_of, _LABELLED_VERDICT.findall(text)) if verdict}
    if len(labelled) > 1:
        return _escalate("it gives contradictory verdicts (" + ", ".join(sorted(labelled)) + ")")
    if labelled:
        verdict: Verdict | None = labelled.pop()
    elif _verdict_words(text) in _ALIASES:
        verdict = _ALIASES[_verdict_words(text)]
    else:
        found = _prose_verdicts(text)
        if len(found) > 1:
            return _escalate("it names several verdicts (" + ", ".join(sorted(found)) + ")")
        verdict = found.pop() if found else None
    if verdict is None:
        return _escalate("it names no verdict")
    sections = _labelled(text)
    reason = _first(sections, ("reason", "why", "rationale")) or text.strip()
    instruction = _first(sections, ("next_instruction", "next_step", "next", "instruction"))
    return _decision(verdict, reason, instruction)


# -- assembling --------------------------------------------------------------------------------


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - len(_TRUNCATED)].rstrip() + _TRUNCATED


def _escalate(problem: str) -> Decision:
    return Decision("escalate", _cap(f"{_UNDERSTOOD}: {problem}; a human is needed", MAX_REASON_CHARS))


def _decision(verdict: Verdict, reason: str, instruction: str) -> Decision:
    reason = reason.strip() or f"the decider chose {verdict} without giving a reason"
    # A next instruction means something when the loop goes on, now or once a person answers.
    instruction = instruction.strip() if verdict in ("continue", "escalate") else ""
    return Decision(verdict, _cap(reason, MAX_REASON_CHARS), _cap(instruction, MAX_INSTRUCTION_CHARS))


def _repetition(decision: Decision, recent_instructions: Sequence[str]) -> Decision:
    if decision.verdict != "continue" or not decision.next_instruction:
        return decision
    if is_degenerate(decision.next_instruction):
        return Decision("failed", "the decider's proposed instruction is degenerate repetition")
    proposed = normalise(decision.next_instruction)
    if not proposed:
        return decision
    times = sum(1 for given in recent_instructions if normalise(given) == proposed)
    if times >= REPEATS_BEFORE_FAILED:
        shown = _cap(decision.next_instruction, 200)
        return Decision(
            "failed",
            f"the agent is going round in circles: the decider proposed an instruction already given "
            f"{times} times ({shown!r})",
        )
    return decision


def parse(text: str, *, recent_instructions: Sequence[str] = ()) -> Decision:
    """Return the decision a decider's answer states; `escalate` when it cannot be read safely."""
    if not text.strip():
        return _escalate("the answer is empty")
    if len(text) > 2 * _ANSWER_HEAD_TAIL_CHARS:
        text = text[:_ANSWER_HEAD_TAIL_CHARS] + "\n" + text[-_ANSWER_HEAD_TAIL_CHARS:]
    objects, prose = _json_objects(text)
    if objects:
        same = Counter(json.dumps(obj, sort_keys=True, default=str) for obj in objects).most_common(1)[0][1]
        if same >= DEGENERATE_REPEATS or (prose.strip() and is_degenerate(prose)):
            return Decision("failed", "the decider's answer is degenerate repetition")
        decision = _from_objects(objects)
    else:
        if is_degenerate(text):
            return Decision("failed", "the decider's answer is degenerate repetition")
        decision = _from_prose(text)
    decision = _repetition(decision, recent_instructions)
    # A JSON answer may spell a NUL as `\u0000`: the run's records cannot hold one.
    return Decision(decision.verdict, storable(decision.reason), storable(decision.next_instruction))


# -- an agent asking a person -----------------------------------------------------------------

# The command-brain protocol's way to ask a person: a line "TETHER_ESCALATE: question" on stderr
# and a non-zero exit (a failed act's detail is "exit status N: <the tail of its stderr>").
_ASKS = re.compile(
    r"^(?:exit status -?\d+(?: \(SIG[A-Z0-9]+\))?:[ \t]*)?TETHER_ESCALATE:[ \t]*(.*?)[ \t]*$", re.MULTILINE
)
MAX_QUESTION_CHARS = 1_000


def question(act_detail: str) -> str:
    """Return the question a failed act asked a person (its last `TETHER_ESCALATE:` line); "" if none."""
    asked = _ASKS.findall(act_detail)
    if not asked:
        return ""
    return _cap(asked[-1], MAX_QUESTION_CHARS) or "the agent asked for a person without saying why"


# -- the `checks` decider ----------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Run-to-run noise in tool output (timings, timestamps, memory addresses) that would make
# identical failures look different to the no-progress rule.
_VOLATILE = (
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds)\b"), "<duration>"),
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x<addr>"),
)


def scrub(output: str) -> str:
    """Return check output without colour codes and run-to-run noise (timings, addresses)."""
    text = _ANSI.sub("", output.replace("\r\n", "\n").replace("\r", "\n"))
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def refusals(tool_calls: Sequence[Mapping[str, object]]) -> list[str]:
    """What the act had refused: each tool call that answered an error, named by its tool and its answer.

    Not by its input: a model that words a refused call differently each time meets the same refusal.
    """
    refused = []
    for call in tool_calls:
        name = str(call.get("name") or "")
        if name.startswith("mcp__") and "__" not in name[5:]:
            continue  # an MCP server that could not be reached: a note of the act, not a call it made
        if call.get("is_error"):
            said = " ".join(scrub(str(call.get("result") or "")).split())[:200]
            refused.append(f"{name} refused: {said}")
    return refused


def _tail(output: str, limit: int, *, clean: bool = True) -> str:
    text = (scrub(output) if clean else output).strip("\n").rstrip()
    if not text.strip():
        return "(no output)"
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    newline = cut.find("\n")
    if 0 <= newline < limit // 4:
        cut = cut[newline + 1 :]
    return f"[... {len(text) - len(cut)} earlier characters omitted]\n{cut}"


def _name(check: Check) -> str:
    return _cap(" ".join(check.name.split()) or "(unnamed)", 100)


def _failing(checks: Sequence[Check]) -> list[Check]:
    failing = [check for check in checks if not check.passed]
    return [check for check in failing if check.required] + [check for check in failing if not check.required]


def backpressure(checks: Sequence[Check]) -> str:
    """Return the instruction that asks the agent to fix the failing checks; "" when none fail.

    Lists each failing check (required ones first) with the tail of its output, capped per check
    and in total. Deterministic: the same failures always give the same text.
    """
    failing = _failing(checks)
    if not failing:
        return ""
    parts = ["These checks fail. Fix them, then continue with the objective."]
    budget = CHECKS_OUTPUT_TOTAL_CHARS
    for check in failing[:MAX_LISTED_CHECKS]:
        kind = "required" if check.required else "optional"
        limit = min(CHECK_OUTPUT_CHARS, budget)
        if limit < 200:
            body = "(output omitted: the length budget for check output is spent)"
        else:
            body = _tail(check.output, limit)
            budget -= len(body)
        parts.append(f"## {_name(check)} ({kind}) failed\n{body}")
    rest = failing[MAX_LISTED_CHECKS:]
    if rest:
        names = ", ".join(_name(check) for check in rest[:50])
        parts.append(_cap(f"... and {len(rest)} more failing checks: {names}", 2_000))
    return "\n\n".join(parts)


def act_failure(act_detail: str) -> str:
    """Return the section of an instruction that tells the agent its last act failed, and how.

    The act's own words (its exit status and the tail of its stderr, a timeout, a program that
    could not start), capped; colour codes go, but not timings: "timed out after 30s" means
    something here.
    """
    text = _ANSI.sub("", act_detail.replace("\r\n", "\n").replace("\r", "\n")).strip()
    detail = _tail(text, ACT_DETAIL_CHARS, clean=False) if text else "(it said nothing about why)"
    return f"Your last act failed. Fix what made it fail, then continue with the objective.\n\n## The act failed\n{detail}"


def _names(checks: Sequence[Check]) -> str:
    return ", ".join(_name(check) for check in checks[:MAX_LISTED_CHECKS]) + (
        f" and {len(checks) - MAX_LISTED_CHECKS} more" if len(checks) > MAX_LISTED_CHECKS else ""
    )


def from_checks(checks: Sequence[Check], *, act_ok: bool, act_detail: str) -> Decision:
    """Return the `checks` decider's decision: done when every required check passes.

    With no required checks configured, the act's own success decides. Otherwise `continue`,
    with the failing checks as the next instruction (see `backpressure`). A failed act is not
    restated here: the policy puts it in front of every next instruction.

    An act that failed asking a person (`question`) escalates with its question, whatever the checks say.
    """
    if not act_ok and (asked := question(act_detail)):
        return Decision("escalate", asked)
    required = [check for check in checks if check.required]
    failing_required = [check for check in required if not check.passed]
    if required and not failing_required:
        return Decision("done", "all required checks passed")  # the verdict names them, with their evidence
    if required:
        return Decision(
            "continue",
            _cap(f"required checks fail: {_names(failing_required)}", MAX_REASON_CHARS),
            backpressure(checks),
        )
    failing = _failing(checks)
    if act_ok:
        reason = "the act succeeded and no required checks are configured"
        if failing:
            reason += f" (optional checks fail: {_names(failing)})"
        return Decision("done", _cap(reason, MAX_REASON_CHARS))
    said = " ".join(act_detail.split())
    reason = "the act failed and no required checks are configured" + (f" ({_cap(said, 300)})" if said else "")
    return Decision("continue", _cap(reason, MAX_REASON_CHARS), backpressure(checks))
