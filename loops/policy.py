"""Decide, after each iteration, whether a run goes on and with what instruction, or how it ends.

Pure: no Django, no clock, no I/O. `next_step` turns the loop's state, the decider's decision
and the iteration's check results into `Continue(instruction)` or `Stop(outcome)`. It keeps the
rules of the outcome taxonomy: a `done` whose required checks fail is not done (the failures go
back to the agent, or the run fails on its last allowed iteration); `done` on the last allowed
iteration is `done`, not `max_iterations`; a passed deadline stops a `continue` (and a wait: see below) but never
overrides a `done` or `failed`; a run whose next instruction repeats one of the last
two, or whose workspace and check results stay unchanged for three iterations, or that
delegates the same work again with nothing changed, or meets the same refusal three times in a
row, stops with `no_progress`. Every way an iteration ends comes here (`after`): a park — for
the children an act delegated to, or for a person's approval — and a question for a person are
bounded like a continue, so a run never begins an iteration past `max_iterations`; on its last
allowed iteration a run may finish, but what would need another iteration ends it
`max_iterations` (its delegate calls not started, its question not asked). A failed act is said twice: to the agent, in front of its next instruction (its
exit status and the tail of its stderr, beside the failing checks), and to the person, in the
detail of a run that stops after it ("the act failed 3 times in a row: exit status 1: ...").

A policy that sees progress (`State.stale_after`, K, set by `TETHER_STALL_ITERATIONS`; 0 is the
classic policy above and nothing more): the checks' own count of what is left to fix
(`loops.progress`, recorded per iteration in `State.track`) that has not improved for K measured
iterations, or a workspace back where an earlier iteration left it (A → B → A: the same workspace
fingerprint with another between), is a stall, handled in stages (`stalled`): first a nudge (the
next instruction says what repeats and asks for another approach); then, when the instance asks for
it (`State.rewind`, its `rewind_on_stall`), a rewind: the workspace goes back to the snapshot of the
best iteration (the best count, the earliest on ties; `Continue.rewind_to`, which the runner has the
rollback's owner restore) and the next instruction says so and asks for a different approach; then
an escalation to a person with a one-line diagnosis and the `forecast`, then a stop `no_progress`
(each stage after K more iterations without a better count, or another return). A better count
starts over: a new stall episode may be nudged and rewound again, once each. An iteration
that waited (a question, an approval, children) or whose check timed out measures nothing and is
never counted.

`verdict` is the one place a `done` is judged: the checks, then what the graders made of it
(`Assessment`s: retry, fail, or do not vouch), then the protected evidence — a run whose
protected files changed ends done but never verified by the machine; a person's review decides.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from loops.decision import Decision, act_failure, backpressure, normalise, scrub
from loops.outcomes import DECIDED

OUTCOMES = DECIDED  # what a Stop may carry (the ways a run can end: loops/outcomes.py)
# The no-progress rules: how many recent instructions a new one may not repeat, and for how many
# iterations an unchanged (workspace fingerprint, checks signature) pair means the loop is stuck.
REPEAT_WINDOW = 2
UNCHANGED_ITERATIONS = 3
# How many recent instructions and (fingerprint, checks) pairs a run keeps: enough for both rules
# (the repeat rule compares the newest with the REPEAT_WINDOW before it).
REFUSALS_IN_A_ROW = 3  # the same refusal this many iterations in a row: the loop is stuck
KEPT = max(REPEAT_WINDOW + 1, UNCHANGED_ITERATIONS, REFUSALS_IN_A_ROW)

# Given when the decider asks to continue without saying how. It carries nothing from the
# decider, so its repetition is not evidence of a stuck loop and the repeat rule ignores it; an
# unchanged workspace and the iteration limit still bound such a run.
GENERIC_INSTRUCTION = "Continue working on the objective."

# The stages of stall handling (`State.stall`, `Continue.stall`, `Stop.stall`), in the order of
# `STALL_ORDER`: the rewind, optional, comes between the nudge and the escalation (numbered last, so a
# stage a run's memory stored before it existed keeps its meaning).
STALL_NUDGE = 1
STALL_ESCALATE = 2
STALL_STOP = 3
STALL_REWIND = 4
STALL_ORDER = (STALL_NUDGE, STALL_REWIND, STALL_ESCALATE, STALL_STOP)
FORECAST_WINDOW = 6  # measured iterations the forecast's rate is taken over


@dataclass(frozen=True)
class Check:
    """The result of one verifier run after an act."""

    name: str
    required: bool
    passed: bool
    output: str = ""
    evidence: str = "exit code"  # "report" (a test report from outside the workspace) or "exit code"
    evidence_detail: str = ""  # e.g. "3 of 3 tests present at the start ran and passed"
    progress: int | None = None  # what is left to fix by its output (`loops.progress.of_check`); None: unknown
    tests_ran: int | None = None  # from the test report, when there is one
    tests_failed: tuple[str, ...] = ()  # the failing tests' ids the report names


@dataclass(frozen=True)
class State:
    """What the policy knows about the run after an iteration."""

    iteration: int  # number of the iteration just finished (1-based)
    max_iterations: int
    act_ok: bool
    act_detail: str = ""
    # Acts that failed in a row, this one included (0 when this act succeeded).
    failed_acts: int = 0
    # Instructions given to earlier iterations and this one, oldest first, as given.
    recent_instructions: tuple[str, ...] = ()
    # (workspace fingerprint, checks signature) per iteration, oldest first, this one included.
    progress: tuple[tuple[str, str], ...] = ()
    has_checks: bool = False
    deadline_passed: bool = False
    # What each recent iteration delegated (a key naming the calls, the workspace and the results
    # the act was given; "" when it delegated nothing), oldest first, this one included.
    delegations: tuple[str, ...] = ()
    # What each recent iteration had refused (a refused tool call or delegate call), oldest first,
    # this one included.
    refusals: tuple[tuple[str, ...], ...] = ()
    # (iteration, progress, workspace fingerprint) per iteration, oldest first, this one included;
    # progress is None where the iteration measured nothing (see `loops.memory`).
    track: tuple[tuple[int, int | None, str], ...] = ()
    stall: tuple[int, int] = (0, 0)  # (stage, iteration) of the last stall handling taken
    stale_after: int = 0  # K: measured iterations without a better count that are a stall; 0: not seen
    rewind: bool = False  # the instance's `rewind_on_stall`: a stall after a nudge goes back to the best iteration
    rewind_refused: str = ""  # why the rewind this iteration asked for could not be made ("": none was refused)
    spent_micros: int = 0  # the run's spend before this iteration, for the forecast
    max_cost_micros: int | None = None  # the run's own cap, if any


@dataclass(frozen=True)
class Continue:
    """Run another iteration with this instruction."""

    instruction: str
    stall: int = 0  # the stall stage this step takes (STALL_NUDGE, STALL_REWIND), 0 for none
    rewind_to: int = 0  # with STALL_REWIND: the iteration whose snapshot the workspace goes back to first


@dataclass(frozen=True)
class Stop:
    """Finish the run with this outcome."""

    outcome: str  # one of OUTCOMES
    detail: str  # human-readable, never empty
    verified: bool | None = None  # for done: True iff required checks ran and passed
    # For done: the checks and graders verified it, but it changed what grades it; a person's
    # acceptance of the review makes it verified.
    held_for_review: bool = False
    stall: int = 0  # the stall stage this stop takes (STALL_ESCALATE, STALL_STOP), 0 for none


@dataclass(frozen=True)
class Park:
    """Wait with no worker before the next iteration: for the children this act delegated to, or a person."""

    kind: str  # "children" or "approval"
    detail: str  # what the run waits for, as a person reads it
    # What is left undone when the run may not wait (its last allowed iteration, the deadline):
    # "its 2 delegate calls were not started: to 'helper' (help with the report); ...".
    undone: str = ""


Step = Continue | Stop | Park


@dataclass(frozen=True)
class Assessment:
    """What a grader makes of a proposed done.

    `outcome` is "done" (keep it; `verified` says whether the grader vouches for it), "retry"
    (reject the answer and go on with `instruction`) or "failed" (rejected on the last allowed
    iteration). `reasons` say why, in words a reviewer reads.
    """

    outcome: str = "done"
    verified: bool = True
    reasons: tuple[str, ...] = ()
    instruction: str = ""
    # What the grader itself established, when it is evidence like a passing check: an independent
    # judge's pass against a rubric, a verifying role's pass. A done with no required check is verified by it.
    evidence: str = ""


def checks_signature(checks: Sequence[Check]) -> str:
    """Return a stable digest of the checks' names, results and output, for the no-progress rule.

    Order-independent, and blind to run-to-run noise in the output (timings, addresses).
    """
    rows = sorted((check.name, check.passed, scrub(check.output)) for check in checks)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def _names(checks: Sequence[Check]) -> str:
    return ", ".join(check.name for check in checks)


def _evidence(checks: Sequence[Check]) -> str:
    """Each passed check with what its pass rests on: "tests by its report: 3 of 3 …", "lint by its exit code"."""
    return "; ".join(
        f"{c.name} by its report: {c.evidence_detail}" if c.evidence == "report" else f"{c.name} by its exit code"
        for c in checks
    )


def _repeated(state: State, instruction: str) -> str:
    """Name the recent iteration whose instruction `instruction` repeats, or ""."""
    proposed = normalise(instruction)
    if proposed and instruction != GENERIC_INSTRUCTION:
        window = state.recent_instructions[-REPEAT_WINDOW:]
        for back, given in enumerate(reversed(window)):
            if normalise(given) == proposed:
                return f"the next instruction repeats the one given to iteration {state.iteration - back}"
    return ""


def _sees_progress(state: State) -> bool:
    """Whether a repeated instruction is a stall rather than a stop: the policy sees this iteration's progress
    and the act changed the workspace (a revert after a regression repeats the instruction it had before)."""
    track = state.track
    return state.stale_after > 0 and len(track) > 1 and track[-1][1] is not None and track[-1][2] != track[-2][2]


def _no_progress(state: State, instruction: str) -> Stop | None:
    rules = []
    if (repeat := _repeated(state, instruction)) and not _sees_progress(state):
        rules.append(repeat)
    recent = state.progress[-UNCHANGED_ITERATIONS:]
    if len(recent) == UNCHANGED_ITERATIONS and len(set(recent)) == 1:
        rules.append(f"workspace and check results unchanged for {UNCHANGED_ITERATIONS} iterations")
    rules += _repeats(state)
    if rules:
        failures = _act_failures(state)
        if failures:
            return Stop("no_progress", f"{failures} (and no progress: {'; '.join(rules)})")
        return Stop("no_progress", "no progress: " + "; ".join(rules))
    return None


def _repeats(state: State) -> list[str]:
    """The no-progress rules that see compositions: a delegation repeated as it was, a refusal met again."""
    rules = []
    last = state.delegations[-2:]
    if len(last) == 2 and last[0] and last[0] == last[1]:
        what = last[1].partition(" ")[2]
        rules.append(
            f"the same delegation ({what}) repeated with no change to the workspace or to its results "
            f"(iterations {state.iteration - 1} and {state.iteration})"
        )
    if refused := _same_refusal(state):
        rules.append(refused)
    return rules


def _same_refusal(state: State) -> str:
    """Name the refusal each of the last `REFUSALS_IN_A_ROW` iterations met, or ""."""
    recent = state.refusals[-REFUSALS_IN_A_ROW:]
    if len(recent) == REFUSALS_IN_A_ROW and (same := set(recent[0]).intersection(*recent[1:])):
        return f"the same refusal {REFUSALS_IN_A_ROW} times in a row: {sorted(same)[0]}"
    return ""


# How much of a failed act's detail a run's final detail quotes: its start (the exit status) and
# its end (the last words of its stderr).
ACT_SUMMARY_HEAD = 80
ACT_SUMMARY_CHARS = 300


def _act_failures(state: State) -> str:
    """Return what the person reads about the failed acts that ended the run, or ""."""
    if state.act_ok:
        return ""
    said = " ".join(state.act_detail.split()) or "it said nothing about why"
    if len(said) > ACT_SUMMARY_CHARS:
        said = f"{said[:ACT_SUMMARY_HEAD].rstrip()} … {said[-(ACT_SUMMARY_CHARS - ACT_SUMMARY_HEAD):].lstrip()}"
    times = max(state.failed_acts, 1)
    if times == 1:
        return f"the last act failed: {said}"
    return f"the act failed {times} times in a row: {said}"


def _with_act_failure(state: State, instruction: str) -> str:
    """Return `instruction` with the failed act in front of it, so the agent sees why."""
    if state.act_ok:
        return instruction
    if instruction == GENERIC_INSTRUCTION:
        return act_failure(state.act_detail)
    return f"{act_failure(state.act_detail)}\n\n{instruction}"


def _bound(state: State, why: str) -> Stop | None:
    """Return the bound that ends the run before another iteration, or None: the deadline, then the limit.

    `why` ends the stop's detail (with its leading "; "), the act's failures after it.
    """
    if failures := _act_failures(state):
        why += f"; {failures}"
    if state.deadline_passed:
        return Stop("timed_out", f"the wall-clock deadline passed after iteration {state.iteration}{why}")
    if state.iteration >= state.max_iterations:
        return Stop(
            "max_iterations",
            f"reached the iteration limit ({state.iteration} of {state.max_iterations}){why}",
        )
    return None


def _go_on(state: State, instruction: str, why: str = "") -> Continue | Stop:
    """Return the Continue a run may take, or the bound that stops it first."""
    instruction = _with_act_failure(state, instruction)
    return (
        _bound(state, why)
        or _no_progress(state, instruction)
        or _stall_step(state, instruction)
        or Continue(instruction)
    )


def _low(track: Sequence[tuple[int, int | None, str]]) -> tuple[int, int] | None:
    """(iteration, count) of the best count in `track`: where it was first reached; None if none was measured."""
    best: tuple[int, int] | None = None
    for number, count, _ in track:
        if count is not None and (best is None or count < best[1]):
            best = (number, count)
    return best


def _returned(track: Sequence[tuple[int, int | None, str]]) -> int:
    """The earlier iteration whose workspace the last one returned to, with another between (A → B → A); 0 if none."""
    if not track or not (now := track[-1][2]):
        return 0
    other = False
    for number, _, fingerprint in reversed(track[:-1]):
        if not fingerprint:
            continue
        if fingerprint != now:
            other = True
        elif other:
            return number
    return 0


def stalled(state: State, instruction: str = "") -> tuple[str, int]:
    """Why the run's progress has stalled ("" when it has not) and the stall stage it had reached (0: none since it last improved).

    A stall is K measured iterations without a better count, a workspace back where an earlier
    iteration left it, or (where progress is measured) a next `instruction` that repeats a recent one.
    """
    if state.stale_after <= 0 or not state.track:
        return "", 0
    low = _low(state.track)
    improved = low[0] if low else 0
    stage = state.stall[0] if state.stall[0] and state.stall[1] >= improved else 0
    since = max(improved, state.stall[1] if stage else 0)
    if low is not None and improved == state.iteration:
        return "", stage  # a better count than ever: this is progress
    stale = [number for number, count, _ in state.track if count is not None and number > since]
    reasons = []
    if back := _returned(state.track):
        reasons.append(f"the workspace returned in iteration {state.iteration} to the state iteration {back} left it in")
    if low is not None and len(stale) >= state.stale_after:
        reasons.append(
            f"the checks' count of what is left has not improved on {low[1]} (iteration {low[0]}) "
            f"for {len(stale)} iterations ({stale[0]}–{stale[-1]})"
        )
    if not reasons and _sees_progress(state) and (repeat := _repeated(state, instruction)):
        reasons.append(repeat)
    return "; ".join(reasons), stage


def _rank(stage: int) -> int:
    """Where `stage` comes in `STALL_ORDER` (0: none taken; a stage not known counts as the last)."""
    if stage <= 0:
        return 0
    return STALL_ORDER.index(stage) + 1 if stage in STALL_ORDER else len(STALL_ORDER)


def rewind_target(track: Sequence[tuple[int, int | None, str]]) -> tuple[int, int] | None:
    """(iteration, count) a stalled run rewinds to: its best count, where it was first reached; None if none."""
    return _low(track)


def _stall_step(state: State, instruction: str) -> Continue | Stop | None:
    """The stall handling this iteration takes: a nudge, a rewind (when asked for), an escalation, a stop; None when not stalled."""
    why, stage = stalled(state, instruction)
    if not why:
        return None
    if _rank(stage) < _rank(STALL_NUDGE):
        return Continue(
            f"Progress has stalled: {why}. What you are doing repeats without moving the checks: do not make the "
            "same change again; step back and try a different approach.\n\n" + instruction,
            stall=STALL_NUDGE,
        )
    best = rewind_target(state.track)
    if _rank(stage) < _rank(STALL_REWIND) and state.rewind and not state.rewind_refused and best is not None:
        number, count = best
        return Continue(
            f"The workspace was rewound: progress stalled ({why}) after a nudge, so the workspace was restored to "
            f"the state iteration {number} left it in, the best so far ({count} left by the checks' count). What "
            f"iterations {number + 1}–{state.iteration} changed is undone. Do not make those changes again: take a "
            "different approach from this state, and run the checks to see where it stands.",
            stall=STALL_REWIND,
            rewind_to=number,
        )
    if _rank(stage) < _rank(STALL_ESCALATE):
        if stage == STALL_REWIND:
            after = f"after a nudge and a rewind in iteration {state.stall[1]} to its best iteration's workspace"
        else:
            after = f"after a nudge in iteration {state.stall[1]} to try another approach"
            if state.rewind_refused:
                after += f"; it was not rewound to its best iteration: {state.rewind_refused}"
        return Stop("escalated", f"stuck: {why}, {after}; forecast: {forecast_of(state)}", stall=STALL_ESCALATE)
    return Stop(
        "no_progress",
        f"no progress: {why}, after a nudge and an escalation to a person (iteration {state.stall[1]})",
        stall=STALL_STOP,
    )


def forecast(
    track: Sequence[tuple[int, int | None, str]], iteration: int, max_iterations: int,
    spent_micros: int = 0, max_cost_micros: int | None = None,
) -> str:
    """Say whether a run is likely to converge before its caps at its current rate, or why not.

    The rate is the fall of the checks' count over the last `FORECAST_WINDOW` measured iterations;
    the caps are the iteration limit and, when the run has one, its money cap at its spend per
    iteration so far.
    """
    measured = [(number, count) for number, count, _ in track if count is not None][-FORECAST_WINDOW:]
    if not measured:
        return "none: the checks print no count of what is left (pytest, unittest, ruff, mypy, eslint or TETHER_PROGRESS)"
    (first_at, first), (last_at, last) = measured[0], measured[-1]
    if last == 0:
        return "the checks count nothing left to fix"
    left = max(max_iterations - iteration, 0)
    if len(measured) < 2:
        return f"none yet: {last} left after one measured iteration"
    rate = (first - last) / (last_at - first_at)
    if rate <= 0:
        return (
            f"not likely to converge: the count went from {first} to {last} over iterations {first_at}–{last_at}"
        )
    needed = int(-(-last // rate))
    if needed > left:
        return (
            f"not likely to converge before its iteration cap: {last} left at {rate:.2g} fewer per iteration "
            f"needs about {needed} more iterations, and {left} remain"
        )
    if max_cost_micros and iteration and spent_micros > 0:
        affordable = int((max_cost_micros - spent_micros) // (spent_micros / iteration))
        if needed > affordable:
            return (
                f"not likely to converge before its budget cap: about {needed} more iterations are needed "
                f"at {rate:.2g} fewer per iteration, and the money left pays for about {max(affordable, 0)}"
            )
    return (
        f"likely to converge before its cap: {last} left at {rate:.2g} fewer per iteration, "
        f"about {needed} more iterations ({left} remain)"
    )


def forecast_of(state: State) -> str:
    """`forecast` for the run `state` describes."""
    return forecast(state.track, state.iteration, state.max_iterations, state.spent_micros, state.max_cost_micros)


def verdict(
    state: State,
    decision: Decision,
    checks: Sequence[Check],
    grades: Sequence[Assessment] = (),
    protected_changed: Sequence[str] = (),
) -> Continue | Stop:
    """Return what a proposed done becomes: the one place "done / verified" is decided.

    Required checks that fail send the agent back (or fail the run on its last allowed iteration);
    a grader's retry or failure wins next; otherwise the run is done, verified only when required
    checks ran and passed (or, with none, a grader's own evidence: a judge's or a verifying role's
    pass), every grader vouches for it and no protected path changed.
    """
    failing = [check for check in checks if check.required and not check.passed]
    if failing:
        claim = f"the agent claimed done but required checks fail: {_names(failing)}"
        if state.iteration >= state.max_iterations:
            return Stop(
                "failed",
                f"{claim} (on the last allowed iteration, {state.iteration} of {state.max_iterations})",
            )
        instruction = "The objective is not done: required checks fail.\n\n" + backpressure(checks)
        return _go_on(state, instruction, f"; {claim}")
    for grade in grades:
        if grade.outcome == "retry":
            return Continue(grade.instruction)
    for grade in grades:
        if grade.outcome == "failed":
            return Stop("failed", "; ".join(grade.reasons) or "the graders rejected the result")
    ran_required = any(check.required for check in checks)
    by_checks = state.has_checks and ran_required
    vouched = [grade.evidence for grade in grades if grade.evidence and grade.verified]
    detail = decision.reason.strip() or "the decider reported the objective done"
    if by_checks:
        detail += f" (verified: {_evidence([c for c in checks if c.required])})"
    elif vouched:
        detail += f" (verified: {'; '.join(vouched)})"
    elif not state.has_checks:
        detail += " (unverified: no checks configured)"
    else:
        detail += " (unverified: no required check ran)"
    reasons = [reason for grade in grades for reason in grade.reasons]
    verified = (by_checks or bool(vouched)) and all(grade.verified for grade in grades)
    if (by_checks or vouched) and not verified:
        detail += " — but not verified: " + "; ".join(reasons or ["a grader did not vouch for it"])
    elif reasons and not verified:
        detail += " — " + "; ".join(reasons)
    if protected_changed:
        shown = ", ".join(protected_changed[:10]) + (
            f" and {len(protected_changed) - 10} more" if len(protected_changed) > 10 else ""
        )
        detail += f" — not verified: it changed what grades it ({shown}); a person must review the diff"
        return Stop("done", detail, verified=False, held_for_review=verified)
    return Stop("done", detail, verified=verified)


def _instruction(decision: Decision, checks: Sequence[Check]) -> str:
    if decision.next_instruction.strip():
        return decision.next_instruction
    if any(not check.passed for check in checks):
        return backpressure(checks)
    return GENERIC_INSTRUCTION


def next_step(
    state: State,
    decision: Decision,
    checks: Sequence[Check],
    grades: Sequence[Assessment] = (),
    protected_changed: Sequence[str] = (),
) -> Continue | Stop:
    """Return what the run does after the iteration described by `state`.

    A done is judged by `verdict`, with the graders' `grades` and the run's changed protected paths.
    """
    reason = decision.reason.strip()
    if decision.verdict == "done":
        return verdict(state, decision, checks, grades, protected_changed)
    if decision.verdict == "failed":
        return Stop("failed", reason or "the agent gave up")
    if decision.verdict == "continue":
        return _go_on(state, _instruction(decision, checks))
    # "escalate", and anything a decider should not have said: a human decides.
    question = reason or "the decider asked for a human"
    return _bounded_wait(state, Stop("escalated", question), f"its question for a person was not asked: {question}")


def _bounded_wait[W: (Stop, Park)](state: State, waiting: W, undone: str) -> W | Stop:
    """Return `waiting` (a park, or a question for a person), or the bound that ends the run first.

    A wait leads to another iteration, so it is bounded as a continue is: the deadline, then the
    iteration limit — on the last allowed iteration what would need another one is left undone.
    """
    return _bound(state, f"; {undone}") or waiting


def after(state: State, proposed: Step) -> Step:
    """The one door: what the run does after the iteration `state` describes, however the act ended.

    `proposed` is what the iteration came to: `next_step`'s answer for an act that was checked and
    decided; a `Park` for one that delegated or needs a person's approval; a `Stop` for one a
    brain error, a person's stop, a reported overdraft or a refused workspace ended. A continue
    and a question for a person were bounded by `next_step`; a park is bounded here, as they are,
    and by the no-progress rules that see compositions (the same delegation again, the same
    refusal again). A stop is final.
    """
    if not isinstance(proposed, Park):
        return proposed
    waiting = _bounded_wait(state, proposed, proposed.undone or f"it did not wait: {proposed.detail}")
    if isinstance(waiting, Stop):
        return waiting
    if proposed.kind == "children" and (rules := _repeats(state)):
        return Stop("no_progress", "no progress: " + "; ".join(rules) + f"; {proposed.undone}")
    return waiting


def may_begin(number: int, max_iterations: int, deadline_passed: bool) -> Stop | None:
    """Return why iteration `number` may not begin (the deadline, the iteration limit), or None.

    The last check of every path into an iteration (a continue, a resume after children or an
    answer, a reaped attempt): a run never begins more than `max_iterations` iterations.
    """
    if deadline_passed:
        return Stop("timed_out", f"the run's wall-clock limit passed before iteration {number}")
    if number > max_iterations:
        return Stop(
            "max_iterations",
            f"reached the iteration limit ({max_iterations} of {max_iterations}): iteration {number} is not begun",
        )
    return None


def resume(state: State) -> Stop | None:
    """Return how a run parked on its children ends instead of going on with their results, or None.

    `state` is the iteration that delegated, with what its delegate calls had refused. The
    children's results are recorded either way.
    """
    if state.deadline_passed:
        return Stop("timed_out", f"the wall-clock deadline passed while its children ran (after iteration {state.iteration}); their results are recorded")
    if state.iteration >= state.max_iterations:
        return Stop(
            "max_iterations",
            f"reached the iteration limit ({state.iteration} of {state.max_iterations}) while its children ran; "
            "their results are recorded",
        )
    if refused := _same_refusal(state):
        return Stop("no_progress", f"no progress: {refused}")
    return None
