"""Grading set where agents are configured: a template file's judge rubric grades its runs, and the judge is paid for.

A template JSON with a rubric loads, an instance made from it has the rubric, and a run's done is
judged by it (the local Messages server plays the judge). The judge's call goes through the run's
meter: its cost is the run's spend and its iteration's cost, and reaches the pools' ledger. A pass
threshold turns a low-scored pass into a fail.
"""

import json

import pytest

from budgets.models import LedgerEntry
from budgets.pricing import cost_micros
from instances import services as instance_services
from instances.brains.base import Usage
from instances.templates_loader import load_templates
from loops.models import Iteration
from reviews import judge
from reviews.models import GradeRecord
from tests.fakes.messages_server import tool_use
from tests.reviews.conftest import MODEL, is_judge_call, judge_prompts

pytestmark = pytest.mark.django_db(transaction=True)

RUBRIC = "NOTES.md names the objective word for word."


def graded(score, verdict="pass"):
    def answer(body):
        assert is_judge_call(body), "only the judge calls Claude in these runs"
        return tool_use(
            "record_grade", {"verdict": verdict, "reasons": ["NOTES.md names it"], "score": score}
        )

    return answer


@pytest.fixture
def from_file(user, tmp_path, script, server, credential, price, monkeypatch):
    """An instance of `user` made, with no override but its key, from a template file that has a judge's rubric."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)  # no base_url override: a plain user may not set one
    writer = script(
        "import os\nopen('NOTES.md', 'w').write(open(os.environ['TETHER_OBJECTIVE_FILE']).read())\nprint('wrote NOTES.md')"
    )
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "noted.json").write_text(
        json.dumps(
            {
                "name": "noted",
                "description": "writes NOTES.md; a judge grades it",
                "brain": "command",
                "command": writer,
                "decider": "checks",
                "max_iterations": 2,
                "checks": [{"name": "notes", "command": ["test", "-s", "NOTES.md"], "required": True}],
                "judge_rubric": RUBRIC,
                "judge_model": MODEL,
                "judge_pass_threshold": 60,
            }
        )
    )
    assert load_templates(folder) == [("noted", True)]
    return instance_services.instance_create(
        user=user, values={"name": "noter", "credential": credential.pk}, template="noted"
    )


def test_a_template_files_rubric_grades_its_runs_and_the_judges_cost_is_in_the_runs_books(
    from_file, server, start, drive, price
):
    assert (from_file.judge_rubric, from_file.judge_model, from_file.judge_pass_threshold) == (
        RUBRIC,
        MODEL,
        60,
    )
    server.responder = graded(90)
    run = drive(start(from_file, objective="Write the release notes"))
    assert (run.outcome, run.verified) == ("done", True)
    [body] = judge_prompts(server)
    assert RUBRIC in body["messages"][0]["content"] and body["model"] == MODEL
    record = GradeRecord.objects.get(run=run)
    assert record.judge["verdict"] == "pass" and record.judge["score"] == 90
    usage = record.usage
    paid = cost_micros(
        Usage(
            model=MODEL,
            **{
                k: usage[k]
                for k in ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens")
            },
        ),
        price,
    )
    assert paid > 0
    # The only Claude call of the run is the judge's: what the run spent is exactly it.
    assert run.spent_micros == paid
    assert sum(Iteration.objects.filter(run=run).values_list("cost_micros", flat=True)) == paid
    assert (
        sum(LedgerEntry.objects.filter(run_id=run.pk).values_list("spent_delta", flat=True)) >= paid
    )  # the pools


def test_a_pass_scored_below_the_threshold_is_not_verified(from_file, server, start, drive):
    server.responder = graded(40)
    run = drive(start(from_file, objective="Write the release notes"))
    assert run.verified is not True
    records = list(GradeRecord.objects.filter(run=run).order_by("iteration"))
    assert records and all(r.judge["verdict"] == "fail" for r in records)
    assert "below the pass threshold of 60" in " ".join(records[-1].judge["reasons"])


def test_the_threshold_rule_is_pure():
    assert judge.passes("pass", 75, 70) == ("pass", [])
    assert judge.passes("pass", 69, 70)[0] == "fail"
    assert judge.passes("pass", None, 70) == (
        "fail",
        ["the judge gave no score, below the pass threshold of 70"],
    )
    assert judge.passes("pass", None, 0) == ("pass", [])
    assert judge.passes("needs-human", 99, 70) == ("needs-human", [])
    assert (
        judge.read_score(
            [{"type": "tool_use", "name": "record_grade", "input": {"verdict": "pass", "score": 101}}]
        )
        is None
    )
    assert (
        judge.read_score([{"type": "text", "text": '{"verdict": "pass", "reasons": [], "score": 88}'}]) == 88
    )


def test_a_done_without_checks_is_verified_only_by_a_graders_own_evidence():
    from loops import policy

    state = policy.State(iteration=1, max_iterations=3, act_ok=True)
    done = policy.Decision("done", "the agent says so")
    judged = policy.Assessment(
        "done", True, (), "", "an independent judge passed it against its rubric, scored 92"
    )
    formatted = policy.Assessment("done", True)  # a response schema met: the form, not the substance
    doubted = policy.Assessment("done", False, ("the judge asks for a person",), "", "")
    verified = policy.verdict(state, done, [], [judged, formatted])
    assert verified.verified and "(verified: an independent judge passed it" in verified.detail
    assert not policy.verdict(state, done, [], [formatted]).verified
    assert not policy.verdict(state, done, [], [judged, doubted]).verified
    assert not policy.verdict(state, done, []).verified
