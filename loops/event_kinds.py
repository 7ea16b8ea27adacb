"""The registry of event kinds: every kind a run's timeline can hold, and how a person reads it.

Pure: no Django, no I/O. One entry per kind says what it means, whether it belongs to one
iteration (the timeline groups those under the iteration's start), which body the timeline
draws under its title, and how to title it from its data (`describe`). The console, the
selectors and the tests read kinds from here; a kind not listed is drawn as its raw data. The
runner writes an iteration's own events as `opening` and `closing` shape them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loops import outcomes, progress
from loops.policy import Stop

if TYPE_CHECKING:
    from instances.brains.base import Reply, Usage
    from loops.decision import Decision
    from loops.policy import Check, Continue

STOP_REASONS = ("stopped mid-act", "stopped by a person")
EXCERPT = 2000  # characters of an instruction or a response an event keeps
VERDICT_TONES = {"done": "good", "continue": "", "escalate": "warn", "failed": "bad"}
OUTCOME_TONES = outcomes.TONES
OUTCOME_LABELS = outcomes.LABELS  # how a person names each way a run can end


# How a run started, after "Started" (the keys are `loops.models.Run.Origin`'s values).
ORIGIN_WORDS = {
    "console": "in the console",
    "api": "through the REST API",
    "mcp": "through MCP",
    "cli": "from the command line",
    "delegation": "by another run's delegate call",
    "schedule": "by a schedule",
    "trigger": "by a webhook trigger",
}


def describe_origin(origin: Mapping[str, Any]) -> str:
    """Return how a run started, for a person: "by webhook trigger 3 (delivery 72d3…)" (`origin`: kind + ref)."""
    kind = str(origin.get("kind") or "")
    if kind == "schedule" and origin.get("schedule") is not None:
        return f"by schedule {origin['schedule']} (firing {origin.get('firing', '?')})"
    if kind == "trigger" and origin.get("trigger") is not None:
        return f"by webhook trigger {origin['trigger']} (delivery {origin.get('delivery', '?')})"
    if kind == "delegation" and origin.get("parent") is not None:
        return f"by run {origin['parent']}'s delegate call"
    return ORIGIN_WORDS.get(kind, kind or "in a way not recorded")


@dataclass(frozen=True)
class Context:
    """What a title may need beyond the event's own data."""

    stopped_by: str = ""  # who asked the run to stop ("" if nobody did)


@dataclass(frozen=True)
class Title:
    """An event's headline: plain text, a quieter note, a tone and links to other runs."""

    text: str
    note: str = ""
    tone: str = ""  # "good" | "bad" | "warn" | "quiet" | "" (neutral)
    links: tuple[tuple[str, int], ...] = ()  # (words before the link, run id): "continuing" run 7


@dataclass(frozen=True)
class Kind:
    name: str
    meaning: str
    describe: Callable[[Mapping[str, Any], Context], Title]
    iteration: bool = False  # recorded inside one iteration (its data carries "iteration")
    body: str = ""  # which body the timeline draws: see templates/loops/run_detail.html
    secondary: bool = False  # bookkeeping a person rarely needs (drawn small)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _word(value: Any) -> str:
    return str(value or "?").replace("_", " ")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _runs(ids: Any, prefix: str = "") -> tuple[tuple[str, int], ...]:
    return tuple((prefix, i) for i in (ids or []) if _int(i) is not None)


def outcome_label(outcome: str) -> str:
    """Return how a person names a run's outcome: "No progress" for "no_progress"."""
    return OUTCOME_LABELS.get(outcome) or _word(outcome).capitalize()


def outcome_sentence(outcome: str, detail: str) -> str:
    """Return an ended run's outcome and detail as one sentence, not naming the outcome twice.

    "no_progress" + "no progress: the instruction repeats" reads "No progress: the instruction repeats".
    """
    label, detail = outcome_label(outcome), (detail or "").strip()
    if not detail:
        return label
    if label.lower() in detail.lower():
        return detail[:1].upper() + detail[1:]
    return f"{label}: {detail}"


def is_stop(data: Mapping[str, Any]) -> bool:
    """Whether a `decision.made` records a person's stop rather than the agent's verdict."""
    reason = str(data.get("reason") or "")
    return data.get("verdict") == "failed" and reason.startswith(STOP_REASONS)


def stopper(ctx: Context) -> str:
    return f"Stopped by {ctx.stopped_by}" if ctx.stopped_by else "Stopped by a person"


def _started(d: Mapping[str, Any], ctx: Context) -> Title:
    links = _runs([d.get("continued_from")], "continuing") + _runs([d.get("parent")], "delegated by")
    origin = d.get("origin")
    if isinstance(origin, Mapping) and origin.get("kind") in ("schedule", "trigger"):
        return Title(f"Started {describe_origin(origin)}", f"for {d.get('by') or 'someone'}", links=links)
    return Title(f"Started by {d.get('by') or 'someone'}", f"via {d['via']}" if d.get("via") else "", links=links)


def _claimed(d: Mapping[str, Any], ctx: Context) -> Title:
    attempt = _int(d.get("attempt")) or 1
    return Title("Picked up by a worker", f"attempt {attempt}" if attempt > 1 else "")


def attempt_label(d: Mapping[str, Any]) -> str:
    """Return "attempt 2 of iteration 3" for an iteration started again after its worker died, else ""."""
    attempt, number = _int(d.get("attempt")), _int(d.get("iteration"))
    if attempt is None or attempt < 2 or number is None:
        return ""
    return f"attempt {attempt} of iteration {number}"


def _iteration_started(d: Mapping[str, Any], ctx: Context) -> Title:
    again = attempt_label(d)
    if again:
        return Title(again[0].upper() + again[1:], "its last worker was lost", "warn")
    return Title(f"Iteration {d.get('iteration', '?')}")


def _dollars(value: Any) -> str:
    """Return "$0.05" for an event's exact dollar string "0.050000" ("$?" when it is not one)."""
    whole, _, frac = str(value or "").partition(".")
    if not whole.lstrip("-").isdigit() or (frac and not frac.isdigit()):
        return "$?"
    return f"${whole}.{frac.rstrip('0').ljust(2, '0')}"


def changed_names(d: Mapping[str, Any], limit: int = 20) -> str:
    """Return what a lost attempt changed, as a person reads it: "it changed a.txt, b.py (deleted)"."""
    if d.get("changes_unknown"):
        return f"what it changed is unknown ({d['changes_unknown']})"
    changes = [c for c in d.get("changed") or [] if isinstance(c, dict)]
    if not changes:
        return "it changed no files"
    names = [f"{c.get('path')}" + (f" ({c['change']})" if c.get("change") in ("added", "deleted") else "")
             for c in changes[:limit]]
    more = len(changes) - len(names) + (_int(d.get("more")) or 0)
    return "it changed " + ", ".join(names) + (f" and {_plural(more, 'more file')}" if more else "")


def _attempt_lost(d: Mapping[str, Any], ctx: Context) -> Title:
    attempt, number = _int(d.get("attempt")) or 1, d.get("iteration", "?")
    text = (
        f"Attempt {attempt} of iteration {number} was lost: worker {d.get('worker') or '?'} died; "
        f"{_dollars(d.get('closed_usd'))} closed; {changed_names(d)}"
    )
    calls = [c for c in d.get("tool_calls") or [] if isinstance(c, dict)]
    unfinished = sum(1 for c in calls if c.get("state") != "finished")
    note = f"{_plural(len(calls), 'tool call')} journaled, {unfinished} unfinished" if calls else ""
    return Title(text, note, "warn")


def _act_finished(d: Mapping[str, Any], ctx: Context) -> Title:
    usage = d.get("usage") or {}
    tokens = (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0) if isinstance(usage, dict) else 0
    note = f"{tokens:,} tokens" if tokens else ""
    if d.get("ok"):
        return Title("Act finished", note)
    if str(d.get("detail") or "").startswith("stopped"):  # a person's stop cut it short: not a failure
        return Title("Act stopped", note, "quiet")
    return Title("Act failed", note, "bad")


def _checks(d: Mapping[str, Any], ctx: Context) -> Title:
    checks = [c for c in d.get("checks") or [] if isinstance(c, dict)]
    passed = sum(1 for c in checks if c.get("passed"))
    failed_required = any(c.get("required", True) and not c.get("passed") for c in checks)
    left = progress.total(c.get("progress") for c in checks)
    said = "" if left is None else f"; {left} left by their count"
    return Title(f"Checks: {passed} of {len(checks)} passed{said}", tone="bad" if failed_required else "good")


def _protected(d: Mapping[str, Any], ctx: Context) -> Title:
    paths = ", ".join(str(p) for p in d.get("paths") or [])
    if len(paths) > 300:
        paths = paths[:299] + "…"
    return Title(f"Changed what grades it: {paths}", "not verifiable without a person's review", "warn")


def _decision(d: Mapping[str, Any], ctx: Context) -> Title:
    if is_stop(d):
        return Title(stopper(ctx), "the act was cut short", "quiet")
    verdict = str(d.get("verdict") or "?")
    return Title(f"Decision: {verdict}", tone=VERDICT_TONES.get(verdict, ""))


def _iteration_finished(d: Mapping[str, Any], ctx: Context) -> Title:
    # cost and duration are formatted by the console (money and time are not this module's)
    return Title(f"Iteration {d.get('iteration', '?')} finished")


def _resumed(d: Mapping[str, Any], ctx: Context) -> Title:
    reason = d.get("reason")
    if reason == "children finished":
        return Title("Resumed: its children finished", links=_runs(d.get("children")))
    if reason == "answered":
        return Title(f"Resumed by {d.get('by') or 'a person'}", "with their answer")
    if reason == "budget":
        return Title(f"Resumed by {d.get('by') or 'a person'}", "budget raised")
    return Title(f"Resumed by {d.get('by') or 'a person'}", str(reason or ""))


def _finished(d: Mapping[str, Any], ctx: Context) -> Title:
    outcome = str(d.get("outcome") or "?")
    if outcome == "cancelled":
        return Title(stopper(ctx), tone="quiet")
    tone = OUTCOME_TONES.get(outcome, "bad")
    if outcome == "done" and d.get("verified") is False:
        tone = "warn"
    return Title(f"Finished: {_word(outcome)}", tone=tone)


def _delegating(d: Mapping[str, Any], ctx: Context) -> Title:
    n = _int(d.get("calls")) or 0
    return Title(f"Delegating: {_plural(n, 'delegate call')}", "the run waits for its children")


def _delegated(d: Mapping[str, Any], ctx: Context) -> Title:
    children = [c for c in d.get("children") or [] if _int(c) is not None]
    refused = d.get("refused") or []
    note = f"{_plural(len(refused), 'call')} refused" if refused else ""
    return Title(f"Started {_plural(len(children), 'child run')}", note, "bad" if refused and not children else "",
                 _runs(children))


def _child_started(d: Mapping[str, Any], ctx: Context) -> Title:
    return Title(f"Child run {_int(d.get('child')) or '?'} started", str(d.get("instance") or ""),
                 links=_runs([d.get("child")]))


def _child_finished(d: Mapping[str, Any], ctx: Context) -> Title:
    outcome = str(d.get("outcome") or "")
    tone = OUTCOME_TONES.get(outcome, "bad")
    if outcome == "done" and d.get("verified") is not True:
        tone = "warn"
    verified = " (verified)" if outcome == "done" and d.get("verified") else ""
    spent = f"spent ${d['spent_usd']}" if isinstance(d.get("spent_usd"), str) else ""
    return Title(f"Child run {_int(d.get('child')) or '?'} finished: {_word(outcome)}{verified}", spent, tone,
                 _runs([d.get("child")]))


def _child_waiting(d: Mapping[str, Any], ctx: Context) -> Title:
    return Title(f"Child run {_int(d.get('child')) or '?'} needs a person", tone="warn", links=_runs([d.get("child")]))


def _child_continued(d: Mapping[str, Any], ctx: Context) -> Title:
    child, continuation = _int(d.get("child")), _int(d.get("as"))
    by = f"by {d['by']}" if d.get("by") else ""
    return Title(f"Child run {child or '?'} continued as run {continuation or '?'}; this run waits for it", by,
                 links=_runs([d.get("as")]))


def _grade(d: Mapping[str, Any], ctx: Context) -> Title:
    outcome = d.get("outcome")
    note = "a person should review it" if d.get("review") else ""
    if outcome == "done" and d.get("verified"):
        return Title("Graded: verified", note, "good")
    if outcome == "done":
        return Title("Graded: done, not verified", note, "warn")
    if outcome == "retry":
        return Title("Graded: the claimed done was not accepted; the agent goes on", note, "warn")
    return Title("Graded: the claimed done was rejected", note, "bad")


def _role(d: Mapping[str, Any], ctx: Context) -> Title:
    if d.get("passed"):
        return Title("Graded by its checking role: passed", tone="good")
    return Title("Graded by its checking role: not passed", tone="bad")


def _rolled_back(d: Mapping[str, Any], ctx: Context) -> Title:
    kept = len(d.get("kept") or []) + (_int(d.get("kept_more")) or 0)
    missed = len(d.get("not_restored") or [])
    notes = [f"by {d.get('by') or 'a person'}", f"undo: {d.get('undo') or '?'}"]
    if kept:
        notes.append(f"{_plural(kept, 'path')} the snapshot does not keep left as they were")
    if missed:
        notes.append(f"{_plural(missed, 'path')} not restored")
    return Title(f"Workspace rolled back to {d.get('label') or d.get('to') or '?'}", "; ".join(notes),
                 "warn" if missed else "")


def _rewound(d: Mapping[str, Any], ctx: Context) -> Title:
    to = d.get("to") or "?"
    if d.get("refused"):
        return Title(f"Not rewound to iteration {to} after a stall", str(d["refused"]), "warn")
    changed = sum(_int(d.get(k)) or 0 for k in ("added", "modified", "deleted"))
    return Title(
        f"Progress stalled: the workspace was rewound to iteration {to}, its best",
        f"{_plural(changed, 'path')} restored; undo: {d.get('undo') or '?'}", "warn",
    )


def _simple(text: str, tone: str = "") -> Callable[[Mapping[str, Any], Context], Title]:
    return lambda d, ctx: Title(text.format(**{k: v for k, v in d.items() if isinstance(v, (str, int))}), tone=tone)


def _by(text: str, tone: str = "") -> Callable[[Mapping[str, Any], Context], Title]:
    return lambda d, ctx: Title(f"{text} {d.get('by') or 'a person'}", f"via {d['via']}" if d.get("via") else "", tone)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in [
        Kind("run.started", "a person (or a parent run) started the run", _started, body="started"),
        Kind("run.claimed", "a worker took the run's lease", _claimed, secondary=True),
        Kind("iteration.started", "an iteration began, with its instruction", _iteration_started,
             iteration=True, body="instruction"),
        Kind("act.started", "the agent began to act", lambda d, ctx: Title("Act started"), iteration=True,
             secondary=True),
        Kind("act.finished", "the agent's act ended: its answer and tool calls", _act_finished,
             iteration=True, body="act"),
        Kind("checks.finished", "the checks ran on the workspace", _checks, iteration=True, body="checks"),
        Kind("protected.changed", "the act changed a protected path (what grades the agent)", _protected,
             iteration=True),
        Kind("grade.finished", "the graders judged a claimed done", _grade, iteration=True, body="grade"),
        Kind("grade.role", "a composition's checking role judged a claimed done", _role, iteration=True,
             body="reason"),
        Kind("decision.made", "the decider's verdict on the iteration", _decision, iteration=True, body="reason"),
        Kind("stall.rewound", "progress stalled after a nudge: the workspace went back to its best iteration's "
             "snapshot (the instance's rewind_on_stall), or why it could not", _rewound, iteration=True),
        Kind("iteration.finished", "an iteration ended: its cost and duration", _iteration_finished,
             iteration=True, body="cost"),
        Kind("run.delegating", "the act asked for child runs; the run waits for them", _delegating,
             iteration=True),
        Kind("run.delegated", "the child runs were started (or refused)", _delegated, body="refused"),
        Kind("run.child_started", "a child run this run delegated to began its first act", _child_started),
        Kind("run.child_finished", "a child run this run delegated to finished", _child_finished),
        Kind("run.child_waiting", "a child run this run delegated to waits for a person", _child_waiting,
             body="question"),
        Kind("run.child_continued", "a person continued a finished child run; this run waits for the continuation",
             _child_continued),
        Kind("interjection.queued", "a person's message, read at the next iteration", _by("Message from"),
             body="quote"),
        Kind("run.stop_requested", "a person asked the run to stop", _by("Stop requested by", "quiet")),
        Kind("run.waiting", "the agent asked a person and waits for an answer",
             _simple("Waiting for you", "warn"), body="question"),
        Kind("run.resumed", "a waiting run goes on (an answer, a raised budget, children finished)", _resumed),
        Kind("attempt.lost", "an attempt's worker died mid-iteration: its closed reservation, its changes",
             _attempt_lost, iteration=True),
        Kind("run.reaped", "the run's worker was lost; the run went back to the queue",
             _simple("Its worker was lost; the run was handed back to the queue", "warn")),
        Kind("run.released", "the run's worker stopped cleanly and handed the run back to the queue at once",
             _simple("Its worker stopped; the run was handed back to the queue", "quiet")),
        Kind("run.finished", "the run ended with an outcome", _finished, body="finished"),
        Kind("workspace.rolled_back", "a person (or the run itself, rewound after a stall) rolled the run's "
             "workspace back to one of its snapshots",
             _rolled_back, body="rollback"),
    ]
}
ITERATION_KINDS = frozenset(name for name, kind in KINDS.items() if kind.iteration)


def unknown(name: str) -> Kind:
    return Kind(name, "not in the registry", lambda d, ctx: Title(name), body="raw")


def kind(name: str) -> Kind:
    """Return the registry entry of `name` (an entry that draws the raw data if it is not known)."""
    return KINDS.get(name) or unknown(name)


def describe(name: str, data: Mapping[str, Any], ctx: Context = Context()) -> Title:
    """Return how a person reads one event."""
    return kind(name).describe(data or {}, ctx)


def needs_stopper(name: str, data: Mapping[str, Any]) -> bool:
    """Whether the title of this event names who stopped the run."""
    return (name == "decision.made" and is_stop(data)) or (name == "run.finished" and data.get("outcome") == "cancelled")


def in_iteration(name: str, data: Mapping[str, Any]) -> int | None:
    """Return the iteration an event belongs to, or None for a run-level event."""
    if name in ITERATION_KINDS:
        return _int((data or {}).get("iteration"))
    return None


# --- what the runner appends for one iteration -------------------------------------------


def opening(number: int, instruction: str, *, attempt: int, interjections: int) -> list[tuple[str, dict[str, Any]]]:
    """The events that open iteration `number`: its start (what it is told, its attempt), its act's start."""
    return [
        ("iteration.started", {
            "iteration": number, "instruction": instruction[:EXCERPT], "interjections": interjections, "attempt": attempt,
        }),
        ("act.started", {"iteration": number}),
    ]


def closing(
    number: int, reply: Reply, checks: list[Check], decision: Decision,
    step: Continue | Stop, usage: Usage, extra: list[tuple[str, dict[str, Any]]],
    iteration_data: dict[str, Any], delegated: list[dict[str, Any]] | None,
) -> list[tuple[str, dict[str, Any]]]:
    """The events that close iteration `number`, in order: act, checks, decision, extras, the end, a park."""
    items: list[tuple[str, dict[str, Any]]] = [
        ("act.finished", {
            "iteration": number, "ok": reply.ok, "detail": reply.detail[:500], "response": reply.text[-EXCERPT:],
            "tool_calls": reply.tool_calls[:50], "usage": usage.as_json(),
        }),
    ]
    if checks:
        items.append(("checks.finished", {
            "iteration": number,
            "checks": [
                {
                    "name": c.name, "required": c.required, "passed": c.passed, "output": c.output[-1000:],
                    "evidence": c.evidence, "evidence_detail": c.evidence_detail, "progress": c.progress,
                }
                for c in checks
            ],
        }))
    items.append(("decision.made", {"iteration": number, "verdict": decision.verdict, "reason": decision.reason[:1000]}))
    items.extend(extra)
    items.append(("iteration.finished", iteration_data))
    if delegated:
        items.append(("run.delegating", {"iteration": number, "calls": len(delegated)}))
    elif isinstance(step, Stop) and step.outcome == outcomes.Outcome.ESCALATED:
        items.append(("run.waiting", {"iteration": number, "question": step.detail[:2000]}))
    return items


__all__ = ["KINDS", "ITERATION_KINDS", "Context", "Kind", "Title", "describe", "kind", "attempt_label",
           "changed_names", "outcome_label", "outcome_sentence", "EXCERPT", "opening", "closing"]

