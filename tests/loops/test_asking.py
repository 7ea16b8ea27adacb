"""An agent asks a person: `TETHER_ESCALATE: question` on stderr, a non-zero exit, and the run waits.

The shipped `ask-first` example (key-free) shows it end to end: waiting with its question, then
an answer resumes it and it ends done (verified).
"""

import io

import pytest
from django.core.management import call_command

from loops import services
from loops.decision import from_checks, question
from loops.policy import Check

# -- the protocol (pure) -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("detail", "asked"),
    [
        ("exit status 3: TETHER_ESCALATE: Which database should I use?", "Which database should I use?"),
        ("exit status 1: working...\nTETHER_ESCALATE:   Deploy to prod?  \n", "Deploy to prod?"),
        ("exit status 1: TETHER_ESCALATE: first\nTETHER_ESCALATE: second", "second"),
        ("exit status 2: TETHER_ESCALATE:", "the agent asked for a person without saying why"),
        ("exit status 1: Traceback ... ValueError", ""),
        ("exit status 1: the docs say to print TETHER_ESCALATE: on stderr", ""),  # mid-line: not a question
        ("", ""),
    ],
)
def test_question_reads_the_last_escalate_line(detail, asked):
    assert question(detail) == asked


def test_a_failed_act_that_asks_escalates_whatever_the_checks_say():
    detail = "exit status 3: TETHER_ESCALATE: What should greeting.txt say?"
    for checks in ([], [Check("greeting", True, False)], [Check("greeting", True, True)]):
        decision = from_checks(checks, act_ok=False, act_detail=detail)
        assert (decision.verdict, decision.reason) == ("escalate", "What should greeting.txt say?")
    # Only a failed act asks: a successful one's detail says nothing the decider reads.
    assert from_checks([Check("greeting", True, True)], act_ok=True, act_detail=detail).verdict == "done"


def test_a_long_question_is_capped():
    asked = question("exit status 1: TETHER_ESCALATE: " + "why? " * 1000)
    assert 0 < len(asked) <= 1000


# -- a scripted agent and the shipped example ---------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
def test_an_agent_that_asks_waits_and_the_answer_resumes_it(user, make_instance, script, start, drive):
    agent = script(
        """
        text = sys.stdin.read()
        if "- blue" not in text:
            print("TETHER_ESCALATE: Which colour?", file=sys.stderr)
            sys.exit(4)
        pathlib.Path("colour").write_text("blue")
        """
    )
    check = script("sys.exit(0 if pathlib.Path('colour').exists() else 1)\n")
    instance = make_instance(user, command=agent, checks=[{"name": "colour", "command": check, "required": True}])
    run = drive(start(instance))
    assert (run.status, run.outcome_detail) == ("waiting", "Which colour?")
    waiting = run.events.get(kind="run.waiting")
    assert waiting.data["question"] == "Which colour?"
    services.run_interject(run=run, user=user, text="blue")
    run = drive(run)
    assert (run.status, run.outcome, run.verified) == ("finished", "done", True)
    assert "- blue" in run.iterations.get(number=2).instruction


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("admin", email="")


@pytestmark_db
def test_the_example_run_waits_for_an_answer_then_finishes(admin, start, drive, tmp_path, settings):
    settings.TETHER_WORKSPACES = tmp_path / "ws"
    out = io.StringIO()
    call_command("example", stdout=out)
    from instances.models import Instance

    asking = Instance.objects.get(name="ask-first", owner=admin)
    assert "ask-first" in out.getvalue() and "objective-ask.txt" in out.getvalue()
    assert asking.brain == "command" and asking.decider == "checks"
    run = drive(start(asking, objective=(settings.BASE_DIR / "examples" / "objective-ask.txt").read_text()))
    assert run.status == "waiting" and run.outcome_detail == "What should greeting.txt say?"
    assert run.events.filter(kind="run.waiting").count() == 1
    first = run.iterations.get(number=1)
    assert not first.act_ok and first.decision["verdict"] == "escalate"

    services.run_interject(run=run, user=admin, text="Hello from my phone")
    run = drive(run)
    assert (run.status, run.outcome, run.verified) == ("finished", "done", True)
    assert (tmp_path / "ws" / "example-ask-first" / "greeting.txt").read_text() == "Hello from my phone\n"
    # `example` again resets the workspace, so the example can be tried afresh.
    call_command("example", stdout=io.StringIO())
    assert not (tmp_path / "ws" / "example-ask-first" / "greeting.txt").exists()
    assert Instance.objects.filter(name="ask-first").count() == 1
