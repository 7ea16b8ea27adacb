"""The loop policy: Continue or Stop after each iteration. Pure: no database."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loops.decision import VERDICTS, Decision, backpressure, normalise
from loops.policy import (
    GENERIC_INSTRUCTION,
    OUTCOMES,
    Check,
    Continue,
    State,
    Stop,
    checks_signature,
    next_step,
)


def state(**fields):
    fields.setdefault("iteration", 1)
    fields.setdefault("max_iterations", 5)
    fields.setdefault("act_ok", True)
    return State(**fields)


def passing(name="pytest", required=True):
    return Check(name=name, required=required, passed=True, output="ok")


def failing(name="pytest", required=True, output="FAILED test_a"):
    return Check(name=name, required=required, passed=False, output=output)


DONE = Decision("done", "all tests pass")
CONTINUE = Decision("continue", "more to do", "write the parser")


# -- done --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "checks", "verified"),
    [
        ({"has_checks": True}, [passing()], True),
        ({"has_checks": True}, [passing(), failing("docs", required=False)], True),
        ({"has_checks": False}, [], False),
        # Checks configured but only optional ones ran: nothing required was verified.
        ({"has_checks": True}, [passing("docs", required=False)], False),
        ({"has_checks": True}, [], False),
    ],
)
def test_done_is_done_and_says_if_verified(fields, checks, verified):
    result = next_step(state(**fields), DONE, checks)
    assert isinstance(result, Stop)
    assert result.outcome == "done"
    assert result.verified is verified
    assert "all tests pass" in result.detail


def test_done_on_last_iteration_is_done():
    result = next_step(state(iteration=5, max_iterations=5, has_checks=True), DONE, [passing()])
    assert result == Stop("done", result.detail, verified=True)


def test_done_past_the_deadline_is_done():
    result = next_step(state(deadline_passed=True), DONE, [])
    assert isinstance(result, Stop) and result.outcome == "done"


def test_done_with_failing_required_checks_is_not_done():
    checks = [failing("pytest", output="E   assert 1 == 2"), passing("ruff")]
    result = next_step(state(has_checks=True), DONE, checks)
    assert isinstance(result, Continue)
    assert "not done" in result.instruction
    assert "E   assert 1 == 2" in result.instruction
    assert backpressure(checks) in result.instruction


def test_done_with_only_optional_checks_failing_is_done():
    result = next_step(state(has_checks=True), DONE, [passing(), failing("docs", required=False)])
    assert isinstance(result, Stop) and result.outcome == "done" and result.verified is True


def test_done_with_failing_required_checks_on_last_iteration_is_failed():
    checks = [failing("pytest"), failing("mypy"), passing("ruff")]
    result = next_step(state(iteration=3, max_iterations=3, has_checks=True), DONE, checks)
    assert isinstance(result, Stop)
    assert result.outcome == "failed"
    assert "claimed done" in result.detail
    assert "pytest" in result.detail and "mypy" in result.detail and "ruff" not in result.detail
    assert result.verified is None


def test_rejected_done_past_the_deadline_times_out():
    result = next_step(state(has_checks=True, deadline_passed=True), DONE, [failing()])
    assert isinstance(result, Stop) and result.outcome == "timed_out"
    assert "claimed done" in result.detail


def test_rejected_done_that_repeats_its_backpressure_is_no_progress():
    checks = [failing()]
    given_before = "The objective is not done: required checks fail.\n\n" + backpressure(checks)
    result = next_step(state(iteration=2, recent_instructions=("objective", given_before)), DONE, checks)
    assert isinstance(result, Stop) and result.outcome == "no_progress"


# -- escalate, failed --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdict", "outcome"),
    [("escalate", "escalated"), ("failed", "failed")],
)
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"deadline_passed": True},
        {"iteration": 5, "max_iterations": 5},
        {"iteration": 9, "max_iterations": 5, "deadline_passed": True},
        {"progress": (("f", "s"),) * 3},
    ],
)
def test_escalate_and_failed_stop_with_their_reason(verdict, outcome, fields):
    result = next_step(state(**fields), Decision(verdict, "the reason"), [failing()])
    if verdict == "escalate" and (fields.get("deadline_passed") or fields.get("iteration", 1) >= 5):
        # A question for a person leads to another iteration: bounded as a continue is (see below).
        assert isinstance(result, Stop) and result.outcome in ("timed_out", "max_iterations")
        assert "its question for a person was not asked: the reason" in result.detail
        return
    assert result == Stop(outcome, "the reason")


@pytest.mark.parametrize(
    ("fields", "outcome", "said"),
    [
        ({"deadline_passed": True}, "timed_out", "the wall-clock deadline passed after iteration 1"),
        ({"iteration": 5, "max_iterations": 5}, "max_iterations", "reached the iteration limit (5 of 5)"),
    ],
)
def test_a_question_or_a_park_on_the_last_iteration_or_past_the_deadline_ends_the_run_naming_the_bound(
    fields, outcome, said
):
    from loops.policy import Park, after

    asked = next_step(state(**fields), Decision("escalate", "which colour?"), [])
    assert asked == Stop(outcome, f"{said}; its question for a person was not asked: which colour?")
    parked = after(state(**fields), Park("children", "children running", undone="its 1 delegate call was not started"))
    assert parked == Stop(outcome, f"{said}; its 1 delegate call was not started")
    # With iterations and time left, a park waits.
    assert after(state(), Park("approval", "needs approval: x")) == Park("approval", "needs approval: x")


@pytest.mark.parametrize("verdict", ["escalate", "failed", "done"])
def test_stop_detail_is_never_empty(verdict):
    result = next_step(state(), Decision(verdict, "  "), [])
    assert isinstance(result, Stop) and result.detail.strip()


def test_unknown_verdict_asks_a_human():
    result = next_step(state(), Decision("maybe", "?"), [])  # type: ignore[arg-type]
    assert isinstance(result, Stop) and result.outcome == "escalated"


# -- continue and its bounds -------------------------------------------------------------------


def test_continue_with_the_deciders_instruction():
    assert next_step(state(), CONTINUE, [failing()]) == Continue("write the parser")


@pytest.mark.parametrize(
    ("iteration", "max_iterations", "expected"),
    [
        (1, 5, None),
        (4, 5, None),
        (5, 5, "max_iterations"),
        (6, 5, "max_iterations"),
        (1, 1, "max_iterations"),
    ],
)
def test_continue_stops_at_the_iteration_limit(iteration, max_iterations, expected):
    result = next_step(state(iteration=iteration, max_iterations=max_iterations), CONTINUE, [])
    if expected is None:
        assert isinstance(result, Continue)
    else:
        assert isinstance(result, Stop) and result.outcome == expected
        assert f"{iteration} of {max_iterations}" in result.detail


@pytest.mark.parametrize(("iteration", "max_iterations"), [(1, 5), (5, 5)])
def test_continue_past_the_deadline_times_out(iteration, max_iterations):
    result = next_step(
        state(iteration=iteration, max_iterations=max_iterations, deadline_passed=True), CONTINUE, []
    )
    assert isinstance(result, Stop) and result.outcome == "timed_out"
    assert "deadline" in result.detail


def test_continue_without_instruction_feeds_back_failing_checks():
    checks = [failing("pytest", output="boom"), passing("ruff")]
    result = next_step(state(), Decision("continue", "r"), checks)
    assert result == Continue(backpressure(checks))


def test_continue_without_instruction_feeds_back_failing_optional_checks():
    checks = [failing("docs", required=False, output="missing docstring")]
    result = next_step(state(), Decision("continue", "r"), checks)
    assert isinstance(result, Continue) and "missing docstring" in result.instruction


def test_continue_without_instruction_after_a_failed_act_says_so():
    result = next_step(
        state(act_ok=False, act_detail="exit status 3: no such file"), Decision("continue", "r"), []
    )
    assert isinstance(result, Continue) and "no such file" in result.instruction
    assert GENERIC_INSTRUCTION not in result.instruction


# -- a failed act: said to the agent and to the person -----------------------------------------

FAILED_ACT = "exit status 1: Traceback (most recent call last):\nOSError: disk full"


@pytest.mark.parametrize(
    ("decision", "checks", "also"),
    [
        # The checks decider's backpressure: the failed act sits beside the failing checks.
        (Decision("continue", "required checks fail: pytest", "fix pytest"), [failing(output="E  1 == 2")], "fix pytest"),
        # No instruction from the decider: the failing checks' output, and the act.
        (Decision("continue", "r"), [failing(output="E  1 == 2")], "E  1 == 2"),
        # An llm decider's own instruction keeps its words, after the act's.
        (Decision("continue", "r", "write the parser"), [], "write the parser"),
        # Nothing else to say: the act alone, not the generic instruction.
        (Decision("continue", "r"), [passing()], None),
        # A done the required checks refute goes back with the act too.
        (DONE, [failing(output="E  1 == 2")], "required checks fail"),
    ],
)
def test_a_failed_act_is_in_front_of_the_next_instruction(decision, checks, also):
    result = next_step(state(act_ok=False, act_detail=FAILED_ACT, failed_acts=1, has_checks=True), decision, checks)
    assert isinstance(result, Continue)
    assert result.instruction.startswith("Your last act failed.")
    assert "exit status 1" in result.instruction and "OSError: disk full" in result.instruction
    if also is None:
        assert GENERIC_INSTRUCTION not in result.instruction
    else:
        assert result.instruction.index("disk full") < result.instruction.index(also)


@pytest.mark.parametrize(
    "detail",
    [
        "act timed out after 30s and was killed",  # a timeout keeps its time: it says what to change
        "could not start 'agent': not found or not executable",  # a spawn error
        "exit status -11: Segmentation fault",  # a crash
    ],
)
def test_every_kind_of_failed_act_reaches_the_agent_as_it_was_said(detail):
    result = next_step(state(act_ok=False, act_detail=detail, failed_acts=1), Decision("continue", "r"), [])
    assert isinstance(result, Continue) and detail in result.instruction


def test_a_failed_acts_output_is_bounded_to_its_tail():
    detail = "exit status 1: " + "noise\n" * 5_000 + "the real error"
    result = next_step(state(act_ok=False, act_detail=detail, failed_acts=1), Decision("continue", "r"), [])
    assert isinstance(result, Continue)
    assert "the real error" in result.instruction and "earlier characters omitted" in result.instruction
    assert len(result.instruction) < 2_500


def test_a_successful_act_adds_nothing():
    result = next_step(state(act_detail="stale words"), Decision("continue", "r", "write the parser"), [])
    assert result == Continue("write the parser")


@pytest.mark.parametrize(
    ("fields", "instruction", "outcome", "named"),
    [
        # Stuck: the same failure three times and nothing changed.
        (
            {"iteration": 3, "failed_acts": 3, "progress": (("f", "s"),) * 3},
            "fix it, attempt 3",
            "no_progress",
            "the act failed 3 times in a row: exit status 1: Traceback (most recent call last): OSError: disk full",
        ),
        # The same failure twice: the next instruction would repeat the last one.
        (
            {"iteration": 2, "failed_acts": 2, "recent_instructions": ("x",)},
            None,  # the instruction the failure makes again
            "no_progress",
            "the act failed 2 times in a row: exit status 1",
        ),
        ({"iteration": 5, "max_iterations": 5, "failed_acts": 4}, "go on", "max_iterations", "the act failed 4 times"),
        ({"deadline_passed": True, "failed_acts": 1}, "go on", "timed_out", "the last act failed: exit status 1"),
        # Older runs did not count failures: the act that just failed still counts once.
        ({"iteration": 5, "max_iterations": 5}, "go on", "max_iterations", "the last act failed: exit status 1"),
    ],
)
def test_a_run_that_stops_after_failed_acts_names_them(fields, instruction, outcome, named):
    fields = {"act_ok": False, "act_detail": FAILED_ACT, **fields}
    if instruction is None:  # what the agent was told after the same failure an iteration ago
        given = next_step(state(**{**fields, "iteration": 1, "recent_instructions": ()}), Decision("continue", "r"), [])
        fields["recent_instructions"] = (given.instruction,)
        instruction = ""
    result = next_step(state(**fields), Decision("continue", "r", instruction), [])
    assert isinstance(result, Stop) and result.outcome == outcome
    assert named in result.detail
    assert not result.detail.startswith("no progress")


def test_the_rule_that_stopped_it_is_still_said():
    result = next_step(
        state(iteration=3, act_ok=False, act_detail="exit status 2: boom", failed_acts=3, progress=(("f", "s"),) * 3),
        Decision("continue", "r", "try again differently"),
        [],
    )
    assert isinstance(result, Stop)
    assert result.detail == (
        "the act failed 3 times in a row: exit status 2: boom "
        "(and no progress: workspace and check results unchanged for 3 iterations)"
    )


def test_a_long_failure_is_quoted_by_its_start_and_end():
    detail = "exit status 1: " + "x" * 5_000 + " the last words"
    result = next_step(
        state(iteration=5, max_iterations=5, act_ok=False, act_detail=detail, failed_acts=2), CONTINUE, []
    )
    assert isinstance(result, Stop)
    assert "exit status 1: xxx" in result.detail and result.detail.endswith("the last words")
    assert len(result.detail) < 500


def test_a_stop_after_successful_acts_does_not_mention_acts():
    result = next_step(state(iteration=5, max_iterations=5, failed_acts=0), CONTINUE, [])
    assert result == Stop("max_iterations", "reached the iteration limit (5 of 5)")


def test_continue_without_instruction_or_failures_is_generic():
    result = next_step(state(), Decision("continue", "r", "   "), [passing()])
    assert result == Continue(GENERIC_INSTRUCTION)


# -- no progress -------------------------------------------------------------------------------

RECENT = ("write the parser", "fix the parser tests", "add docs")


@pytest.mark.parametrize(
    ("instruction", "expected"),
    [
        ("add docs", "no_progress"),  # the instruction this iteration was given
        ("Add docs.", "no_progress"),  # trivially re-worded
        ("  please ADD   docs! ", "no_progress"),
        ("fix the parser tests", "no_progress"),  # two back
        ("write the parser", None),  # three back: not no_progress
        ("add more docs", None),
        ("fix the parser tests on line 12", None),
    ],
)
def test_repeated_instruction_is_no_progress(instruction, expected):
    result = next_step(
        state(iteration=3, recent_instructions=RECENT), Decision("continue", "r", instruction), []
    )
    if expected is None:
        assert result == Continue(instruction)
    else:
        assert isinstance(result, Stop) and result.outcome == expected
        assert "repeats" in result.detail


def test_repeat_detail_names_the_iteration():
    result = next_step(
        state(iteration=3, recent_instructions=RECENT), Decision("continue", "r", "fix the parser tests"), []
    )
    assert isinstance(result, Stop) and "iteration 2" in result.detail


def test_repeated_failing_checks_backpressure_is_no_progress():
    checks = [failing("pytest", output="FAILED test_a in 0.12s")]
    first = next_step(
        state(iteration=1, recent_instructions=("objective",)), Decision("continue", "r"), checks
    )
    assert isinstance(first, Continue)
    same_again = [failing("pytest", output="FAILED test_a in 0.31s")]
    second = next_step(
        state(iteration=2, recent_instructions=("objective", first.instruction)),
        Decision("continue", "r"),
        same_again,
    )
    assert isinstance(second, Stop) and second.outcome == "no_progress"


def test_generic_instruction_repeated_is_not_no_progress():
    recent = ("objective", GENERIC_INSTRUCTION, GENERIC_INSTRUCTION)
    result = next_step(state(iteration=3, recent_instructions=recent), Decision("continue", "r"), [])
    assert result == Continue(GENERIC_INSTRUCTION)


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        ((), None),
        ((("f1", "s1"),), None),
        ((("f1", "s1"), ("f1", "s1")), None),
        ((("f1", "s1"), ("f1", "s1"), ("f1", "s1")), "no_progress"),
        ((("f0", "s0"), ("f1", "s1"), ("f1", "s1"), ("f1", "s1")), "no_progress"),
        ((("f1", "s1"), ("f1", "s1"), ("f1", "s1"), ("f2", "s1")), None),  # changed this iteration
        ((("f1", "s1"), ("f1", "s2"), ("f1", "s1")), None),  # checks changed in between
        ((("f1", "s1"), ("f2", "s1"), ("f1", "s1")), None),  # workspace changed in between
        ((("f1", "s1"), ("f1", "s1"), ("f1", "s2")), None),
    ],
)
def test_unchanged_workspace_and_checks_is_no_progress(progress, expected):
    result = next_step(state(iteration=4, progress=progress), CONTINUE, [])
    if expected is None:
        assert isinstance(result, Continue)
    else:
        assert isinstance(result, Stop) and result.outcome == expected
        assert "unchanged" in result.detail


def test_both_no_progress_rules_are_named():
    result = next_step(
        state(iteration=3, recent_instructions=RECENT, progress=(("f", "s"),) * 3),
        Decision("continue", "r", "add docs"),
        [],
    )
    assert isinstance(result, Stop) and "repeats" in result.detail and "unchanged" in result.detail


def test_iteration_limit_wins_over_no_progress():
    result = next_step(
        state(iteration=5, max_iterations=5, recent_instructions=("x",), progress=(("f", "s"),) * 3),
        Decision("continue", "r", "x"),
        [],
    )
    assert isinstance(result, Stop) and result.outcome == "max_iterations"


# -- checks_signature --------------------------------------------------------------------------


def test_checks_signature_is_stable_and_order_free():
    a, b = failing("pytest", output="E1"), passing("ruff")
    assert checks_signature([a, b]) == checks_signature([b, a]) == checks_signature((a, b))
    assert len(checks_signature([a, b])) == 64
    assert checks_signature([]) == checks_signature(())


@pytest.mark.parametrize(
    "changed",
    [
        failing("pytest", output="E2"),
        failing("pytest2", output="E1"),
        passing("pytest"),
        Check("pytest", required=True, passed=True, output="E1"),
    ],
)
def test_checks_signature_changes_with_results(changed):
    assert checks_signature([failing("pytest", output="E1")]) != checks_signature([changed])


def test_checks_signature_ignores_timings():
    assert checks_signature([failing(output="1 failed in 0.21s")]) == checks_signature(
        [failing(output="1 failed in 3.5s")]
    )


# -- properties --------------------------------------------------------------------------------

_instructions = st.sampled_from(["fix a", "Fix A.", "fix b", "", "write docs", GENERIC_INSTRUCTION])
_checks = st.lists(
    st.builds(
        Check,
        name=st.sampled_from(["pytest", "ruff", "mypy"]),
        required=st.booleans(),
        passed=st.booleans(),
        output=st.sampled_from(["", "E1 bad", "FAILED test_a"]),
    ),
    max_size=4,
)
_states = st.builds(
    State,
    iteration=st.integers(1, 8),
    max_iterations=st.integers(1, 8),
    act_ok=st.booleans(),
    act_detail=st.sampled_from(["", "exit status 1"]),
    failed_acts=st.integers(0, 4),
    recent_instructions=st.lists(_instructions, max_size=5).map(tuple),
    progress=st.lists(
        st.tuples(st.sampled_from(["f1", "f2"]), st.sampled_from(["s1", "s2"])), max_size=5
    ).map(tuple),
    has_checks=st.booleans(),
    deadline_passed=st.booleans(),
)
_decisions = st.builds(
    Decision,
    verdict=st.sampled_from(VERDICTS),
    reason=st.sampled_from(["", "because", "  "]),
    next_instruction=_instructions,
)

_examples = settings(max_examples=300, deadline=None)


@_examples
@given(_states, _decisions, _checks)
def test_policy_properties(s, decision, checks):
    result = next_step(s, decision, checks)
    required = [c for c in checks if c.required]

    assert result == next_step(s, decision, list(checks)), "deterministic"

    if isinstance(result, Continue):
        assert s.iteration < s.max_iterations
        assert not s.deadline_passed
        assert result.instruction.strip()
        assert decision.verdict in ("continue", "done")
        if result.instruction != GENERIC_INSTRUCTION:
            assert normalise(result.instruction) not in {normalise(i) for i in s.recent_instructions[-2:]}
        assert len(s.progress) < 3 or len(set(s.progress[-3:])) > 1
        if not s.act_ok and decision.verdict == "continue":
            assert result.instruction.startswith("Your last act failed.")
        return

    assert result.outcome in OUTCOMES
    assert result.detail.strip()
    if result.outcome in ("max_iterations", "timed_out", "no_progress"):
        assert ("act failed" in result.detail) is (not s.act_ok)
    if result.outcome == "done":
        assert decision.verdict == "done"
        assert all(c.passed for c in required)
        assert isinstance(result.verified, bool)
        if result.verified:
            assert s.has_checks and required and all(c.passed for c in required)
    else:
        assert result.verified is None


@_examples
@given(_states, _decisions, _checks, st.integers(0, 3))
def test_policy_never_continues_at_the_limit(s, decision, checks, beyond):
    at_limit = replace(s, iteration=s.max_iterations + beyond)
    assert not isinstance(next_step(at_limit, decision, checks), Continue)


@_examples
@given(_states, st.sampled_from(["escalate", "failed", "done"]), _checks)
def test_deadline_never_overrides_a_final_verdict(s, verdict, checks):
    s = replace(s, deadline_passed=True)
    result = next_step(s, Decision(verdict, "r"), checks)
    assert isinstance(result, Stop)
    if verdict == "escalate":  # a question waits for a person, and an answer would begin an iteration
        assert result.outcome == "timed_out" and "its question for a person was not asked" in result.detail
    elif verdict == "failed":
        assert result.outcome == "failed"
    elif all(c.passed for c in checks if c.required):
        assert result.outcome == "done"
    else:
        # A done that is not done is a continue, which the deadline stops, unless it was the last try.
        assert result.outcome == ("failed" if s.iteration >= s.max_iterations else "timed_out")


@_examples
@given(_states, _checks)
def test_done_is_final_on_any_iteration_when_required_checks_pass(s, checks):
    passed = [replace(c, passed=True) if c.required else c for c in checks]
    result = next_step(s, DONE, passed)
    assert isinstance(result, Stop) and result.outcome == "done"


def test_a_verified_done_names_each_required_check_once_with_its_evidence():
    from loops import policy
    from loops.decision import from_checks

    checks = [
        policy.Check("tests", True, True, evidence="report", evidence_detail="3 of 3 tests present at the start ran and passed"),
        policy.Check("greeting", True, True),
    ]
    state = policy.State(iteration=1, max_iterations=3, act_ok=True, has_checks=True)
    step = policy.next_step(state, from_checks(checks, act_ok=True, act_detail=""), checks)
    assert step == policy.Stop(
        "done",
        "all required checks passed (verified: tests by its report: 3 of 3 tests present at the start ran and "
        "passed; greeting by its exit code)",
        verified=True,
    )
    assert step.detail.count("greeting") == 1
