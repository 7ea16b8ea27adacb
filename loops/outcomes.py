"""The ways a run can end, stated once: each outcome, how a person names it, and which may follow.

Pure (no Django, no I/O), so the pure core can read it: `Run.Outcome` (loops/models.py) is built
from `Outcome`, the policy decides among `DECIDED`, `loops.continuation` continues `CONTINUABLE`,
the console names them with `LABELS`, and every other list of outcomes (the review queue, the
notifications, rollback, the "needs you" page) is a set of these members, so a new or renamed
outcome cannot be missed in one of them (tests/ops/test_one_owner.py fails on a literal list).
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """How a finished run ended (the value is what `Run.outcome` stores)."""

    DONE = "done"
    ESCALATED = "escalated"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET_EXHAUSTED = "budget_exhausted"
    MAX_ITERATIONS = "max_iterations"
    NO_PROGRESS = "no_progress"
    CREDENTIAL_ERROR = "credential_error"
    PROVIDER_ERROR = "provider_error"
    TIMED_OUT = "timed_out"
    CRASHED = "crashed"


# How a person names each way a run can end.
LABELS: dict[str, str] = {
    Outcome.DONE: "Done",
    Outcome.ESCALATED: "Escalated to a person",
    Outcome.FAILED: "Failed",
    Outcome.CANCELLED: "Stopped",
    Outcome.BUDGET_EXHAUSTED: "Out of budget",
    Outcome.MAX_ITERATIONS: "Reached the iteration limit",
    Outcome.NO_PROGRESS: "No progress",
    Outcome.CREDENTIAL_ERROR: "Credential error",
    Outcome.PROVIDER_ERROR: "The model provider failed",
    Outcome.TIMED_OUT: "Timed out",
    Outcome.CRASHED: "Crashed",
}

# How a page colours an outcome; any other is "bad".
TONES: dict[str, str] = {Outcome.DONE: "good", Outcome.CANCELLED: "quiet", Outcome.ESCALATED: "warn"}

# What the policy may decide (`loops.policy.Stop`); the others come from a person (cancelled), the
# meter (budget_exhausted), the brain (credential_error, provider_error) or the reaper (crashed).
DECIDED = frozenset(
    {
        Outcome.DONE,
        Outcome.ESCALATED,
        Outcome.FAILED,
        Outcome.MAX_ITERATIONS,
        Outcome.NO_PROGRESS,
        Outcome.TIMED_OUT,
    }
)

# What a finished run may be continued from: every way a run can end but out of budget, which is
# resumed in place instead (`services.run_resume`). A verified done is continued as a follow-up.
CONTINUABLE = tuple(o for o in Outcome if o != Outcome.BUDGET_EXHAUSTED)

# The loop stopped without doing the work: a person should look (the console's "needs you").
TROUBLE = (
    Outcome.FAILED,
    Outcome.CRASHED,
    Outcome.CREDENTIAL_ERROR,
    Outcome.PROVIDER_ERROR,
    Outcome.NO_PROGRESS,
    Outcome.TIMED_OUT,
    Outcome.BUDGET_EXHAUSTED,
    Outcome.MAX_ITERATIONS,
)

# The run failed, for a notification: every outcome but done, a person's choice (cancelled,
# escalated) and money (budget_exhausted, which has a notice of its own).
FAILED_FOR_NOTICE = frozenset(Outcome) - {
    Outcome.DONE,
    Outcome.CANCELLED,
    Outcome.ESCALATED,
    Outcome.BUDGET_EXHAUSTED,
}

# The agent gave up or went round in circles: the review queue gets the run.
GAVE_UP = frozenset({Outcome.FAILED, Outcome.NO_PROGRESS, Outcome.MAX_ITERATIONS})

# A bound the person set ended the run (the digest's "stopped by a bound").
BOUND = frozenset({Outcome.BUDGET_EXHAUSTED, Outcome.MAX_ITERATIONS, Outcome.TIMED_OUT})

# A bound or a stop ended the run: its page offers a rollback to the last verified state first.
BOUND_OR_STOP = BOUND | {Outcome.CANCELLED, Outcome.NO_PROGRESS}
