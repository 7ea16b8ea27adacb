"""The runner drives real command-brain loops to each outcome it can reach."""

import pytest

from loops.models import Event, Iteration, Run

pytestmark = pytest.mark.django_db(transaction=True)


def kinds(run):
    return list(Event.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))


def test_checks_pass_means_done_verified(user, make_instance, script, start, drive, tmp_path):
    agent = script("pathlib.Path('answer.txt').write_text('42')\nprint('wrote the answer')\n")
    check = script("sys.exit(0 if pathlib.Path('answer.txt').read_text() == '42' else 1)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "answer", "command": check, "required": True}])
    run = drive(start(inst))
    assert (run.status, run.outcome, run.verified) == ("finished", "done", True)
    assert run.iterations_done == 1
    seqs = list(Event.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert kinds(run)[0] == "run.started" and kinds(run)[-1] == "run.finished"
    for kind in ["act.started", "act.finished", "checks.finished", "decision.made", "iteration.finished"]:
        assert kind in kinds(run)


def test_no_checks_done_is_unverified(user, make_instance, script, start, drive):
    inst = make_instance(user, command=script("print('hello')\n"))
    run = drive(start(inst))
    assert (run.outcome, run.verified) == ("done", False)


def test_backpressure_feeds_failures_into_next_instruction(user, make_instance, script, start, drive):
    # The agent fixes the file only once it is told which check failed.
    agent = script(
        """
        instruction = sys.stdin.read()
        if 'needs-fix' in instruction:
            pathlib.Path('state').write_text('fixed')
        print('saw:', instruction[:80])
        """
    )
    check = script("p = pathlib.Path('state'); print('needs-fix'); sys.exit(0 if p.exists() else 1)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "state", "command": check}])
    run = drive(start(inst))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, 2)
    second = Iteration.objects.get(run=run, number=2)
    assert "needs-fix" in second.instruction


def test_done_on_last_iteration_is_done(user, make_instance, script, start, drive):
    agent = script(
        """
        p = pathlib.Path('count'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
        """
    )
    check = script(
        "n = int(pathlib.Path('count').read_text()); print('count', n); sys.exit(0 if n >= 3 else 1)\n"
    )
    inst = make_instance(user, command=agent, checks=[{"name": "count", "command": check}])
    run = drive(start(inst, max_iterations=3))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, 3)


def test_max_iterations(user, make_instance, script, start, drive):
    agent = script(
        "p = pathlib.Path('n'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))\n"
    )
    check = script("print('count is', pathlib.Path('n').read_text()); sys.exit(1)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "never", "command": check}])
    run = drive(start(inst, max_iterations=3))
    assert (run.outcome, run.iterations_done) == ("max_iterations", 3)
    assert "3" in run.outcome_detail


def test_no_progress_when_instruction_repeats(user, make_instance, script, start, drive):
    inst = make_instance(
        user,
        command=script("print('trying')\n"),
        checks=[{"name": "stuck", "command": script("print('E1 same');sys.exit(1)\n")}],
    )
    run = drive(start(inst, max_iterations=10))
    assert run.outcome == "no_progress"
    assert run.iterations_done == 2
    assert "repeat" in run.outcome_detail.lower()


def test_no_progress_when_workspace_and_checks_unchanged(user, make_instance, script, start, drive):
    # Each act fails with a different message (so instructions differ) but changes nothing.
    agent = script("import random; print('attempt', random.random(), file=sys.stderr); sys.exit(3)\n")
    inst = make_instance(user, command=agent)
    run = drive(start(inst, max_iterations=10))
    assert run.outcome == "no_progress"
    assert run.iterations_done == 3
    assert "unchanged" in run.outcome_detail.lower()


def test_failed_act_is_recorded_and_loop_goes_on(user, make_instance, script, start, drive):
    agent = script(
        """
        p = pathlib.Path('tries'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
        sys.exit(0 if n >= 2 else 7)
        """
    )
    inst = make_instance(user, command=agent)
    run = drive(start(inst))
    first = Iteration.objects.get(run=run, number=1)
    assert not first.act_ok and "exit status 7" in first.act_detail
    assert (run.outcome, run.iterations_done) == ("done", 2)


def test_timed_out_when_deadline_passes(user, make_instance, script, start, drive):
    from django.utils import timezone

    inst = make_instance(
        user, command=script("print('x')\n"), checks=[{"name": "c", "command": script("sys.exit(1)\n")}]
    )
    run = start(inst, max_minutes=5)
    Run.objects.filter(pk=run.pk).update(deadline=timezone.now())
    run = drive(run)
    assert run.outcome == "timed_out"


def test_interjection_is_folded_into_next_instruction(user, make_instance, script, start, drive):
    from loops import services

    inst = make_instance(user, command=script("print(sys.stdin.read())\n"))
    run = start(inst)
    services.run_interject(run=run, user=user, text="use tabs, not spaces")
    run = drive(run)
    first = Iteration.objects.get(run=run, number=1)
    assert "use tabs, not spaces" in first.instruction
    assert run.interjections.get().consumed_in_iteration == 1


def test_command_environment_is_scrubbed(user, make_instance, script, start, drive, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-should-not-leak")
    monkeypatch.setenv("DATABASE_PASSWORD", "hunter2")
    agent = script(
        """
        env = dict(os.environ)
        objective = pathlib.Path(env['TETHER_OBJECTIVE_FILE']).read_text()
        json.dump({'input_tokens': 10, 'output_tokens': 5, 'cost_usd': 0.25}, open(env['TETHER_USAGE_FILE'], 'w'))
        print(json.dumps({'env': sorted(env), 'objective': objective, 'extra': env.get('GREETING')}))
        """
    )
    inst = make_instance(user, command=agent, env={"GREETING": "hi"})
    run = drive(start(inst, objective="count the stars"))
    response = Iteration.objects.get(run=run, number=1).response
    assert "sk-ant-should-not-leak" not in response and "hunter2" not in response
    # With a usable key the act may get the metering gateway's per-act token as ANTHROPIC_API_KEY,
    # never the server's key (checked above).
    assert "DATABASE" not in response
    assert '"objective": "count the stars"' in response and '"extra": "hi"' in response
    for name in ["TETHER_RUN_ID", "TETHER_ITERATION", "TETHER_OBJECTIVE_FILE", "TETHER_USAGE_FILE"]:
        assert name in response
    assert run.spent_micros == 250_000


def test_act_timeout_kills_the_command_and_is_a_failed_step(user, make_instance, script, start, drive):
    inst = make_instance(user, command=script("time.sleep(30)\n"), act_timeout_seconds=1, max_iterations=1)
    run = drive(start(inst))
    first = Iteration.objects.get(run=run, number=1)
    assert not first.act_ok and "timed out" in first.act_detail
    assert run.outcome == "max_iterations"
