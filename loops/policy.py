"""Decide, after each iteration, whether a run goes on and with what instruction, or how it ends.

Pure: no Django, no clock, no I/O. `next_step` turns the loop's state, the decider's decision
and the iteration's check results into `Continue(instruction)` or `Stop(outcome)`. It keeps the
rules of the outcome taxonomy: a `done` whose required checks fail is not done (the failures go
back to the agent, or the run fails on its last allowed iteration); `done` on the last allowed
iteration is `done`, not `max_iterations`; a passed deadline stops a `continue` but never
overrides a `done`, `failed` or `escalated`; a run whose next instruction repeats one of the last
two, or whose workspace and check results stay unchanged for three iterations, stops with
`no_progress`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from loops.decision import Decision, act_failure, backpressure, normalise, scrub

OUTCOMES = frozenset({"done", "escalated", "failed", "max_iterations", "no_progress", "timed_out"})
# The no-progress rules: how many recent instructions a new one may not repeat, and for how many
# iterations an unchanged (workspace fingerprint, checks signature) pair means the loop is stuck.
REPEAT_WINDOW = 2
UNCHANGED_ITERATIONS = 3

# Given when the decider asks to continue without saying how. It carries nothing from the
# decider, so its repetition is not evidence of a stuck loop and the repeat rule ignores it; an
# unchanged workspace and the iteration limit still bound such a run.
GENERIC_INSTRUCTION = "Continue working on the objective."


@dataclass(frozen=True)
class Check:
    """The result of one verifier run after an act."""

    name: str
    required: bool
    passed: bool
    output: str = ""


@dataclass(frozen=True)
class State:
    """What the policy knows about the run after an iteration."""

    iteration: int  # number of the iteration just finished (1-based)
    max_iterations: int
    act_ok: bool
    act_detail: str = ""
    # Instructions given to earlier iterations and this one, oldest first, as given.
    recent_instructions: tuple[str, ...] = ()
    # (workspace fingerprint, checks signature) per iteration, oldest first, this one included.
    progress: tuple[tuple[str, str], ...] = ()
    has_checks: bool = False
    deadline_passed: bool = False


@dataclass(frozen=True)
class Continue:
    """Run another iteration with this instruction."""

    instruction: str


@dataclass(frozen=True)
class Stop:
    """Finish the run with this outcome."""

    outcome: str  # one of OUTCOMES
    detail: str  # human-readable, never empty
    verified: bool | None = None  # for done: True iff required checks ran and passed


def checks_signature(checks: Sequence[Check]) -> str:
    """Return a stable digest of the checks' names, results and output, for the no-progress rule.

    Order-independent, and blind to run-to-run noise in the output (timings, addresses).
    """
    rows = sorted((check.name, check.passed, scrub(check.output)) for check in checks)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def _names(checks: Sequence[Check]) -> str:
    return ", ".join(check.name for check in checks)


def _no_progress(state: State, instruction: str) -> Stop | None:
    rules = []
    proposed = normalise(instruction)
    if proposed and instruction != GENERIC_INSTRUCTION:
        window = state.recent_instructions[-REPEAT_WINDOW:]
        for back, given in enumerate(reversed(window)):
            if normalise(given) == proposed:
                rules.append(
                    f"the next instruction repeats the one given to iteration {state.iteration - back}"
                )
                break
    recent = state.progress[-UNCHANGED_ITERATIONS:]
    if len(recent) == UNCHANGED_ITERATIONS and len(set(recent)) == 1:
        rules.append(f"workspace and check results unchanged for {UNCHANGED_ITERATIONS} iterations")
    if rules:
        return Stop("no_progress", "no progress: " + "; ".join(rules))
    return None


def _go_on(state: State, instruction: str, why: str = "") -> Continue | Stop:
    """Return the Continue a run may take, or the bound that stops it first."""
    if state.deadline_passed:
        return Stop("timed_out", f"the wall-clock deadline passed after iteration {state.iteration}{why}")
    if state.iteration >= state.max_iterations:
        return Stop(
            "max_iterations",
            f"reached the iteration limit ({state.iteration} of {state.max_iterations}){why}",
        )
    return _no_progress(state, instruction) or Continue(instruction)


def _done(state: State, decision: Decision, checks: Sequence[Check]) -> Continue | Stop:
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
    ran_required = any(check.required for check in checks)
    verified = state.has_checks and ran_required
    detail = decision.reason.strip() or "the decider reported the objective done"
    if verified:
        detail += f" (verified: required checks passed: {_names([c for c in checks if c.required])})"
    elif not state.has_checks:
        detail += " (unverified: no checks configured)"
    else:
        detail += " (unverified: no required check ran)"
    return Stop("done", detail, verified=verified)


def _instruction(state: State, decision: Decision, checks: Sequence[Check]) -> str:
    if decision.next_instruction.strip():
        return decision.next_instruction
    if any(not check.passed for check in checks):
        return backpressure(checks)
    if not state.act_ok:
        return act_failure(state.act_detail)
    return GENERIC_INSTRUCTION


def next_step(state: State, decision: Decision, checks: Sequence[Check]) -> Continue | Stop:
    """Return what the run does after the iteration described by `state`."""
    reason = decision.reason.strip()
    if decision.verdict == "done":
        return _done(state, decision, checks)
    if decision.verdict == "failed":
        return Stop("failed", reason or "the agent gave up")
    if decision.verdict == "continue":
        return _go_on(state, _instruction(state, decision, checks))
    # "escalate", and anything a decider should not have said: a human decides.
    return Stop("escalated", reason or "the decider asked for a human")
