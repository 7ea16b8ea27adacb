"""The policy that sees progress, pure: stalls are nudged, then escalated, then stopped; progress never is.

Each scenario is fed through `Memory` and `policy.next_step` as the runner feeds them: an
iteration's check prints pytest's summary, its workspace is a tree label, and the instruction the
policy gives is the next iteration's. `stale_after=0` is the classic policy, for comparison.
"""

from dataclasses import replace

from loops import policy, progress
from loops.decision import Decision, from_checks
from loops.memory import Memory
from loops.policy import Check, Continue, State, Stop

K = 3


def output(tree, left):
    failing = "\n".join(f"FAILED tests/test_app.py::test_{tree}_{i}" for i in range(left))
    return f"{failing}\n{left} failed, 10 passed in 0.05s\n" if left else "10 passed in 0.05s\n"


def simulate(steps, stale_after=K, max_iterations=30, waits=(), rewind=False):
    """Run `steps` ((tree, left) per iteration) until the policy stops; return [(iteration, step)].

    An iteration in `waits` asked a person (the decider escalated) and was answered at once.
    """
    memory, given, taken = Memory(), "make the tests pass", []
    for number, (tree, left) in enumerate(steps, 1):
        out = output(tree, left)
        checks = [Check("tests", True, left == 0, out, progress=progress.of_check(out, left == 0))]
        measured = progress.total(c.progress for c in checks)
        decision = from_checks(checks, act_ok=True, act_detail="")
        if number in waits:
            decision = type(decision)("escalate", "which database should I use?")
        state = State(
            iteration=number,
            max_iterations=max_iterations,
            act_ok=True,
            recent_instructions=memory.recent_instructions(given),
            progress=memory.recent_progress(tree, policy.checks_signature(checks)),
            has_checks=True,
            track=memory.recent_track(number, measured, tree),
            stall=memory.stall,
            stale_after=stale_after,
            rewind=rewind,
        )
        step = policy.next_step(state, decision, checks)
        memory = memory.after(
            instruction=given,
            fingerprint=tree,
            signature=policy.checks_signature(checks),
            act_ok=True,
            response="",
            checks={"tests": left == 0},
            verdict=decision.verdict,
            number=number,
            progress=measured,
            stall=step.stall,
            rewound_to=step.rewind_to if isinstance(step, Continue) else 0,
        )
        taken.append((number, step))
        if number in waits and isinstance(step, Stop) and step.outcome == "escalated":
            given = "the person answered: use sqlite"
            continue
        if isinstance(step, Stop):
            break
        given = step.instruction
    return taken


def ending(taken):
    number, step = taken[-1]
    return number, step.outcome if isinstance(step, Stop) else "continue"


def nudged(taken):
    return [n for n, step in taken if isinstance(step, Continue) and step.stall == policy.STALL_NUDGE]


def churn(left, times=30):
    return [(f"c{i}", left) for i in range(times)]


def test_a_churner_is_nudged_then_escalated_while_the_classic_policy_runs_it_to_its_cap():
    taken = simulate(churn(7))
    assert nudged(taken) == [4]
    number, step = taken[-1]
    assert (number, step.outcome, step.stall) == (7, "escalated", policy.STALL_ESCALATE)
    assert "has not improved on 7 (iteration 1) for 3 iterations (5–7)" in step.detail
    assert "after a nudge in iteration 4" in step.detail and "forecast: not likely to converge" in step.detail
    nudge = dict(taken)[4].instruction
    assert nudge.startswith("Progress has stalled:") and "different approach" in nudge
    assert "These checks fail" in nudge  # what fails still follows
    assert ending(simulate(churn(7), stale_after=0)) == (30, "max_iterations")


def test_after_the_escalation_is_answered_a_run_still_stuck_stops_no_progress():
    memory_stall = (policy.STALL_ESCALATE, 7)
    track = tuple((n, 7, f"c{n}") for n in range(1, 11))
    state = State(
        iteration=10, max_iterations=30, act_ok=True, track=track, stall=memory_stall, stale_after=K
    )
    step = policy.next_step(
        state,
        from_checks([Check("tests", True, False, output("c10", 7), progress=7)], act_ok=True, act_detail=""),
        [],
    )
    assert isinstance(step, Stop) and (step.outcome, step.stall) == ("no_progress", policy.STALL_STOP)
    assert "after a nudge and an escalation to a person (iteration 7)" in step.detail


def test_an_oscillation_is_detected_by_the_workspace_returning_to_an_earlier_tree():
    taken = simulate([(t, 4) for t in "ABCABCABCABC"])
    assert nudged(taken) == [4]
    assert (
        "the workspace returned in iteration 4 to the state iteration 1 left it in"
        in dict(taken)[4].instruction
    )
    number, step = taken[-1]
    assert (number, step.outcome) == (5, "escalated") and "returned in iteration 5" in step.detail
    assert ending(simulate([(t, 4) for t in "ABC" * 10], stale_after=0)) == (30, "max_iterations")


def test_waiting_for_a_person_is_never_counted_as_stuck():
    # Two iterations that asked a person between the measured ones: only measured iterations count.
    steps = churn(7, 8)
    taken = simulate(steps, waits=(2, 3))
    assert nudged(taken) == [6]  # 1 measured, 2-3 waited, 4-6 three measured without a better count
    assert nudged(simulate(steps)) == [4]
    memory = Memory().after(
        instruction="x",
        fingerprint="t",
        signature="s",
        act_ok=True,
        response="",
        checks={},
        verdict="continue",
        number=1,
        progress=7,
        delegation="k to 'helper': 'do it'",
    )
    assert memory.track == ((1, None, "t"),)  # an iteration that delegated waits for its children


def test_a_better_count_starts_over_and_a_steady_fixer_is_never_stopped():
    plateaus = [(f"f{i}", n) for i, n in enumerate([n for n in range(5, -1, -1) for _ in range(4)][:-3])]
    taken = simulate(plateaus)
    assert ending(taken) == (21, "done")
    assert nudged(taken) == [4, 8, 12, 16, 20]  # a nudge on each long plateau, never a stop
    slow = [(f"s{i}", n) for i, n in enumerate(range(12, -1, -1))]
    taken = simulate(slow)
    assert ending(taken) == (13, "done") and nudged(taken) == []


def test_a_revert_after_a_regression_is_nudged_not_stopped():
    steps = [("r1", 6), ("r2", 4), ("r3", 9), ("r2", 4), ("r5", 2), ("r6", 0)]
    taken = simulate(steps)
    assert ending(taken) == (6, "done") and nudged(taken) == [4]
    assert ending(simulate(steps, stale_after=0)) == (4, "no_progress")  # the classic repeat rule stops it


def test_unmeasured_iterations_leave_the_classic_rules_in_charge():
    state = State(
        iteration=5,
        max_iterations=30,
        act_ok=True,
        stale_after=K,
        track=tuple((n, None, f"t{n % 2}") for n in range(1, 6)),
    )
    why, _ = policy.stalled(state)
    assert "returned" in why  # a return to an earlier tree is seen without a count
    state = State(
        iteration=5,
        max_iterations=30,
        act_ok=True,
        stale_after=K,
        track=tuple((n, None, f"t{n}") for n in range(1, 6)),
    )
    assert policy.stalled(state) == ("", 0)


def test_the_forecast_says_whether_the_run_converges_before_its_caps():
    steady = tuple((n, 12 - n, f"t{n}") for n in range(1, 5))  # 11, 10, 9, 8
    assert policy.forecast(steady, 4, 30).startswith("likely to converge before its cap: 8 left at 1 fewer")
    assert policy.forecast(steady, 4, 8).startswith("not likely to converge before its iteration cap")
    said = policy.forecast(steady, 4, 30, spent_micros=400_000, max_cost_micros=600_000)
    assert said.startswith("not likely to converge before its budget cap") and "pays for about 2" in said
    flat = tuple((n, 7, f"t{n}") for n in range(1, 5))
    assert (
        policy.forecast(flat, 4, 30)
        == "not likely to converge: the count went from 7 to 7 over iterations 1–4"
    )
    assert policy.forecast((), 1, 30).startswith("none: the checks print no count")
    assert policy.forecast(((1, 0, "t"),), 1, 30) == "the checks count nothing left to fix"


def test_an_unchanged_workspace_repeating_its_instruction_still_stops_at_once():
    # Nothing was edited and the checks say the same: the classic repeat rule stops it, as before.
    assert ending(simulate([("A", 5), ("A", 5), ("A", 5)])) == (2, "no_progress")


# --- stage 2: the rewind to the best iteration (off unless the instance asks for it) -------------

WORSE = [("w0", 5), ("w1", 3), *((f"w{i}", 4 + i) for i in range(2, 20))]  # its best is iteration 2's 3


def rewound(taken):
    return [(n, step.rewind_to) for n, step in taken if isinstance(step, Continue) and step.stall == policy.STALL_REWIND]


def test_a_run_getting_worse_is_nudged_then_rewound_to_its_best_iteration_then_escalated():
    taken = simulate(WORSE, rewind=True)
    assert nudged(taken) == [5] and rewound(taken) == [(8, 2)]
    said = dict(taken)[8].instruction
    assert said.startswith("The workspace was rewound: progress stalled (the checks' count of what is left has not improved on 3")
    assert "restored to the state iteration 2 left it in, the best so far (3 left" in said
    assert "iterations 3–8 changed is undone" in said and "different approach" in said
    number, step = taken[-1]  # once only: the next stall is handed to a person
    assert (number, step.outcome, step.stall) == (11, "escalated", policy.STALL_ESCALATE)
    assert "after a nudge and a rewind in iteration 8 to its best iteration's workspace" in step.detail


def test_without_rewind_on_stall_nothing_is_rewound():
    taken = simulate(WORSE)
    assert rewound(taken) == [] and ending(taken) == (8, "escalated")
    assert "after a nudge in iteration 5 to try another approach;" in taken[-1][1].detail


def test_the_best_iteration_is_the_earliest_of_equal_counts_and_a_better_count_starts_a_new_episode():
    ties = [("a", 4), ("b", 3), ("c", 3), ("d", 3), ("e", 3), ("f", 3), ("g", 3), ("h", 3), ("i", 3)]
    assert rewound(simulate(ties, rewind=True)) == [(8, 2)]
    # After the rewind it gets better (a new best, 1), then stalls again: a new episode, nudged and rewound again.
    again = [*WORSE[:8], ("n9", 2), ("n10", 1), *((f"m{i}", 6) for i in range(11, 30))]
    assert rewound(simulate(again, rewind=True)) == [(8, 2), (16, 10)]


def test_a_refused_rewind_goes_on_to_the_escalation_and_says_why():
    memory, track = (policy.STALL_NUDGE, 5), tuple((n, c, f"w{n}") for n, (_, c) in enumerate(WORSE[:8], 1))
    state = State(iteration=8, max_iterations=30, act_ok=True, has_checks=True, track=track, stall=memory,
                  stale_after=K, rewind=True)
    checks = [Check("tests", True, False, output("w8", 11), progress=11)]
    decision = from_checks(checks, act_ok=True, act_detail="")
    assert policy.next_step(state, decision, checks).rewind_to == 2
    step = policy.next_step(replace(state, rewind_refused="run 7 (x) is running on this workspace"), decision, checks)
    assert isinstance(step, Stop) and (step.outcome, step.stall) == ("escalated", policy.STALL_ESCALATE)
    assert "it was not rewound to its best iteration: run 7 (x) is running on this workspace" in step.detail


def test_the_agent_cannot_ask_for_a_rewind_nor_choose_where_to():
    # What the decider (which the agent's answer feeds) says carries no rewind: only the policy's stall
    # stage does, and it goes to the best count's iteration whatever the instruction names.
    asked = "Rewind the workspace to iteration 1 and roll back. The workspace was rewound: go on."
    steps = [("a", 5), ("b", 4), ("c", 3)]
    memory, given = Memory(), "make the tests pass"
    for number, (tree, left) in enumerate(steps, 1):
        checks = [Check("tests", True, False, output(tree, left), progress=left)]
        state = State(iteration=number, max_iterations=30, act_ok=True, has_checks=True, stale_after=K, rewind=True,
                      recent_instructions=memory.recent_instructions(given),
                      track=memory.recent_track(number, left, tree), stall=memory.stall)
        step = policy.next_step(state, Decision("continue", "", asked), checks)
        assert isinstance(step, Continue) and (step.stall, step.rewind_to) == (0, 0)
        memory = memory.after(instruction=given, fingerprint=tree, signature=tree, act_ok=True, response="",
                              checks={}, verdict="continue", number=number, progress=left, stall=step.stall)
        given = step.instruction
    track = tuple((n, c, t) for n, (t, c) in enumerate(WORSE[:8], 1))
    state = State(iteration=8, max_iterations=30, act_ok=True, has_checks=True, track=track,
                  stall=(policy.STALL_NUDGE, 5), stale_after=K, rewind=True)
    step = policy.next_step(state, Decision("continue", "", asked), [])
    assert step.rewind_to == 2 and "iteration 1" not in step.instruction
    assert not {"stall", "rewind_to"} & set(Decision.__dataclass_fields__)
