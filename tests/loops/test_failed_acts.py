"""A failed act is said to the agent (its next instruction) and to the person (the run's detail).

Real runner, real scripted command agents (sandboxed), real checks.
"""

import pytest

from loops.models import Event, Iteration

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_agent_that_fails_every_act_is_told_why_and_the_run_names_it(
    user, make_instance, script, start, drive
):
    # Fails every time with the same complaint (its iteration in it, so no instruction repeats),
    # and changes nothing: the loop stops for no progress after three failed acts.
    agent = script(
        """
        sys.stdin.read()
        print('working on it')
        print('Traceback (most recent call last):', file=sys.stderr)
        print('OSError: disk full on try ' + os.environ['TETHER_ITERATION'], file=sys.stderr)
        sys.exit(1)
        """
    )
    check = script("print('E   assert answer == 42'); sys.exit(1)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "answer", "command": check}])
    run = drive(start(inst, max_iterations=6))

    second = Iteration.objects.get(run=run, number=2)
    assert "exit status 1" in second.instruction
    assert "OSError: disk full on try 1" in second.instruction
    assert "E   assert answer == 42" in second.instruction  # beside the failing check's output
    assert second.instruction.index("disk full") < second.instruction.index("assert answer")
    third = Iteration.objects.get(run=run, number=3)
    assert "OSError: disk full on try 2" in third.instruction

    assert (run.outcome, run.iterations_done) == ("no_progress", 3)
    assert run.outcome_detail.startswith(
        "the act failed 3 times in a row: exit status 1: Traceback (most recent call last): "
        "OSError: disk full on try 3"
    )
    finished = Event.objects.get(run=run, kind="run.finished")
    assert finished.data["detail"] == run.outcome_detail


def test_a_failed_act_without_checks_ends_the_run_naming_it(user, make_instance, script, start, drive):
    agent = script("sys.stdin.read(); print('no: permission denied', file=sys.stderr); sys.exit(2)\n")
    inst = make_instance(user, command=agent)
    run = drive(start(inst, max_iterations=5))
    second = Iteration.objects.get(run=run, number=2)
    assert "exit status 2: no: permission denied" in second.instruction
    # The same failure twice: the agent would be told the same thing again.
    assert run.outcome == "no_progress"
    assert run.outcome_detail.startswith("the act failed 2 times in a row: exit status 2: no: permission denied")


def test_a_program_that_cannot_start_is_named(user, make_instance, start, drive, tmp_path):
    inst = make_instance(user, command=[str(tmp_path / "no-such-agent")])
    run = drive(start(inst, max_iterations=2))
    second = Iteration.objects.get(run=run, number=2)
    assert "could not start" in second.instruction and "no-such-agent" in second.instruction
    assert "the act failed 2 times in a row: could not start" in run.outcome_detail


def test_a_timed_out_act_is_named_with_its_limit(user, make_instance, script, start, drive):
    inst = make_instance(user, command=script("time.sleep(30)\n"), act_timeout_seconds=1)
    run = drive(start(inst, max_iterations=1))
    assert run.outcome == "max_iterations"
    assert run.outcome_detail == (
        "reached the iteration limit (1 of 1); the last act failed: act timed out after 1s and was killed"
    )


def test_a_crash_is_named_by_its_signal(user, make_instance, script, start, drive):
    agent = script(
        """
        import signal
        print('about to crash', file=sys.stderr); sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
        """
    )
    inst = make_instance(user, command=agent)
    run = drive(start(inst, max_iterations=2))
    second = Iteration.objects.get(run=run, number=2)
    assert "(SIGSEGV): about to crash" in second.instruction
    assert "(SIGSEGV): about to crash" in run.outcome_detail


def test_a_timed_out_act_says_where_its_stderr_left_off(user, make_instance, script, start, drive):
    agent = script("print('waiting for the lock', file=sys.stderr); sys.stderr.flush(); time.sleep(30)\n")
    inst = make_instance(user, command=agent, act_timeout_seconds=1)
    run = drive(start(inst, max_iterations=2))
    said = "act timed out after 1s and was killed; its stderr ended: waiting for the lock"
    assert said in Iteration.objects.get(run=run, number=2).instruction
    assert run.outcome_detail.endswith(f"the act failed 2 times in a row: {said}")


def test_an_act_killed_by_a_signal_may_still_have_asked_a_person():
    from loops.decision import question

    assert question("exit status 143 (SIGTERM): TETHER_ESCALATE: Which branch?") == "Which branch?"
