"""Graders beyond commands: the response check, the LLM rubric judge, and "claimed done, changed nothing"."""

from decimal import Decimal

import pytest

from loops import policy
from reviews import graders, judge, snapshots
from reviews.graders import FinalAct, check_response
from reviews.models import GradeRecord, Grading
from tests.fakes.messages_server import Error, text
from tests.reviews.conftest import KEY, grade_reply, judge_prompts

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "required": ["summary", "files_changed"],
    "properties": {"summary": {"type": "string"}, "files_changed": {"type": "array", "items": {"type": "string"}}},
}
PASSED = [policy.Check("tests", True, True, "3 passed")]


def verdict(grade, checks=PASSED, iteration=1, max_iterations=3):
    """Return the policy's verdict on a done the decider proposed, with `grade` fed to it."""
    state = policy.State(iteration=iteration, max_iterations=max_iterations, act_ok=True, has_checks=True)
    return policy.verdict(state, policy.Decision("done", "checks passed"), checks, [grade.assessment])


# --- the response check (pure) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        '{"summary": "fixed", "files_changed": ["a.py"]}',
        'Here is my report:\n```json\n{"summary": "fixed", "files_changed": []}\n```\nThanks.',
        'Done. {"summary": "fixed", "files_changed": ["a.py", "b.py"]} That is all.',
    ],
)
def test_an_answer_holding_conforming_json_passes(answer):
    assert check_response(answer, schema=SCHEMA, pattern="").passed


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ('{"summary": "fixed", "files_changed": "all of them"}', "at files_changed: 'all of them' is not of type 'array'"),
        ('{"summary": "fixed"}', "'files_changed' is a required property"),
        ("I fixed everything, all tests pass!", "holds no JSON value"),
        ("[1, 2]", "is not of type 'object'"),
    ],
)
def test_a_well_formed_answer_violating_the_schema_fails_saying_why(answer, problem):
    result = check_response(answer, schema=SCHEMA, pattern="")
    assert not result.passed and problem in result.detail


def test_the_pattern_check():
    assert check_response("Result: PASS (12 cases)", schema=None, pattern=r"^Result: (PASS|FAIL)").passed
    failed = check_response("All good!", schema=None, pattern=r"^Result: (PASS|FAIL)")
    assert not failed.passed and "does not match" in failed.detail
    assert check_response("anything", schema=None, pattern="") is None
    broken = check_response("x", schema=None, pattern="(")
    assert broken.misconfigured and "not a regular expression" in broken.detail
    broken = check_response("{}", schema={"type": "no-such-type"}, pattern="")
    assert broken.misconfigured and "not a JSON Schema" in broken.detail


# --- configuration -----------------------------------------------------------------------------------


def test_an_instance_grading_overrides_its_templates_field_by_field(user):
    from instances.models import AgentTemplate
    from instances.templates_loader import create_instance

    coder = AgentTemplate.objects.get(name="coder")
    Grading.objects.create(template=coder, judge=True, judge_criteria="tests cover the fix", sample_percent=Decimal(25))
    inst = create_instance(owner=user, template="coder", name="c", overrides={"checks": []})
    config = graders.config_for(inst)
    assert (config.judge, config.judge_criteria, config.sample_percent) == (True, "tests cover the fix", Decimal(25))
    assert config.expects_changes  # a coder, even without checks

    Grading.objects.create(instance=inst, judge=False, response_pattern="^ok")
    config = graders.config_for(inst)
    assert (config.judge, config.response_pattern, config.judge_criteria) == (False, "^ok", "tests cover the fix")


def test_defaults_without_any_grading(user, make_instance, settings):
    settings.TETHER_REVIEW_SAMPLE_PERCENT = 5
    config = graders.config_for(make_instance(user))
    assert config == graders.Config(sample_percent=Decimal(5), expects_changes=False)
    checked = make_instance(user, checks=[{"name": "t", "command": ["true"]}])
    assert graders.config_for(checked).expects_changes


# --- the judge ------------------------------------------------------------------------------------------


@pytest.fixture
def judged(user, make_instance, start, server, credential, price):
    """A queued run of an instance whose done is graded by the judge on the local server."""
    inst = make_instance(user, base_url=server.url, credential=credential, model="claude-test-1")
    Grading.objects.create(instance=inst, judge=True, judge_criteria="the README names the new flag")
    return start(inst, objective="document the --fast flag in README.md")


@pytest.mark.parametrize(
    ("verdict", "outcome", "verified", "review"),
    [("pass", "done", True, False), ("needs-human", "done", False, True), ("fail", "retry", False, False)],
)
def test_the_judges_verdict_decides_the_grade(judged, server, verdict, outcome, verified, review):
    server.enqueue(grade_reply(verdict, "the reason"))
    grade = graders.grade(judged, FinalAct(1, "I documented it."), [])
    assert (grade.outcome, grade.verified, grade.review) == (outcome, verified, review)
    assert grade.judge.verdict == verdict and grade.judge.reasons == ["the reason"]
    assert grade.usage.calls == 1 and grade.usage.input_tokens > 0
    record = GradeRecord.objects.get(run=judged, iteration=1)
    assert record.judge["verdict"] == verdict and record.outcome == outcome


def test_the_judge_is_an_independent_prompt_that_sees_the_evidence(judged, server):
    snapshots.take(judged)
    (judged.instance.workspace_path() / "README.md").write_text("Use --fast to skip checks.\n")
    server.enqueue(grade_reply("pass", "the README names --fast"))
    graders.grade(judged, FinalAct(1, "README updated with --fast."), PASSED)
    [body] = judge_prompts(server)
    system = body["system"][0]["text"]
    prompt = body["messages"][0]["content"]
    assert "independent reviewer" in system and "record_decision" not in str(body)
    assert body["tool_choice"] == {"type": "tool", "name": "record_grade"}
    assert "document the --fast flag in README.md" in prompt
    assert "the README names the new flag" in prompt
    assert "README updated with --fast." in prompt
    assert "+Use --fast to skip checks." in prompt
    assert "tests (required): passed" in prompt
    assert KEY not in str(body)


def test_a_judge_that_cannot_answer_routes_to_a_person(judged, server):
    server.enqueue(Error(401, "invalid x-api-key"))
    grade = graders.grade(judged, FinalAct(1, "done"), [])
    assert (grade.outcome, grade.verified, grade.review) == ("done", False, True)
    assert "could not run" in grade.judge.error and server.calls == 1  # a refused key is not retried
    assert KEY not in grade.judge.error


def test_an_unreadable_judgment_routes_to_a_person(judged, server):
    server.enqueue(text("Looks fine to me, probably."))
    grade = graders.grade(judged, FinalAct(1, "done"), [])
    assert grade.judge.verdict == "needs-human" and "could not be read" in grade.judge.error
    assert grade.review


def test_a_judge_answering_in_json_text_is_read():
    assert judge.read_answer([{"type": "text", "text": 'Sure: {"verdict": "FAIL", "reasons": "no tests"}'}]) == (
        "fail",
        ["no tests"],
    )
    assert judge.read_answer([{"type": "text", "text": '{"verdict": "maybe"}'}]) is None


# --- the grade of a done -------------------------------------------------------------------------------


@pytest.fixture
def coding(user, make_instance, start):
    """A queued run of an instance with a required check, its workspace snapshot taken at the start."""
    inst = make_instance(user, checks=[{"name": "tests", "command": ["true"], "required": True}], max_iterations=3)
    inst.workspace_path().mkdir(parents=True)
    (inst.workspace_path() / "app.py").write_text("x = 1\n")
    run = start(inst)
    snapshots.take(run)
    return run


def fingerprint(run):
    from loops.checks import fingerprint as digest

    return digest(run.instance.workspace_path())


def test_a_done_with_changes_and_passing_checks_is_verified(coding):
    (coding.instance.workspace_path() / "app.py").write_text("x = 2\n")
    grade = graders.grade(coding, FinalAct(1, "changed x", fingerprint(coding)), PASSED)
    assert (grade.outcome, grade.verified, grade.review, grade.unchanged_workspace) == ("done", True, False, False)
    step = verdict(grade)
    assert step == policy.Stop("done", "checks passed (verified: tests by its exit code)", verified=True)


def test_claimed_done_changed_nothing_is_not_verified(coding):
    grade = graders.grade(coding, FinalAct(1, "I fixed it!", fingerprint(coding)), PASSED)
    assert (grade.outcome, grade.verified, grade.review, grade.unchanged_workspace) == ("done", False, True, True)
    step = verdict(grade)
    assert isinstance(step, policy.Stop) and step.outcome == "done" and step.verified is False
    assert "claimed done, changed nothing" in step.detail


def test_a_failed_required_check_never_verifies(coding):
    (coding.instance.workspace_path() / "app.py").write_text("x = 2\n")
    failing = [policy.Check("tests", True, False, "1 failed"), policy.Check("lint", False, True)]
    grade = graders.grade(coding, FinalAct(1, "done", fingerprint(coding)), failing)
    assert grade.verified  # the graders vouch; the checks are the policy's to judge
    assert isinstance(verdict(grade, failing), policy.Continue)
    assert verdict(grade, failing, iteration=3).outcome == "failed"


def test_a_schema_violation_goes_back_to_the_agent_then_fails_at_the_cap(coding):
    Grading.objects.create(instance=coding.instance, response_schema=SCHEMA)
    (coding.instance.workspace_path() / "app.py").write_text("x = 2\n")
    answer = '{"summary": "all fixed", "files_changed": "app.py"}'
    grade = graders.grade(coding, FinalAct(1, answer, fingerprint(coding)), PASSED)
    assert (grade.outcome, grade.verified) == ("retry", False)
    assert "not of type 'array'" in grade.instruction
    step = verdict(grade)
    assert isinstance(step, policy.Continue) and step.instruction == grade.instruction

    last = graders.grade(coding, FinalAct(3, answer, fingerprint(coding)), PASSED)
    assert last.outcome == "failed"
    step = verdict(last, iteration=3)
    assert step.outcome == "failed" and "last allowed iteration, 3 of 3" in step.detail
    assert GradeRecord.objects.filter(run=coding).count() == 2


def test_grades_change_only_a_done(coding):
    grade = graders.grade(coding, FinalAct(1, "x", fingerprint(coding)), PASSED)
    state = policy.State(iteration=1, max_iterations=3, act_ok=True, has_checks=True)
    for said in ("failed", "escalate"):
        step = policy.next_step(state, policy.Decision(said, "why"), PASSED, [grade.assessment])
        assert step == policy.next_step(state, policy.Decision(said, "why"), PASSED)
    kind, data = grade.as_event(1)
    assert kind == "grade.finished" and data["iteration"] == 1 and data["unchanged_workspace"] is True


def test_a_misconfigured_response_check_sends_the_done_to_a_person_not_back_to_the_agent(coding):
    Grading.objects.create(instance=coding.instance, response_pattern="(unclosed")
    (coding.instance.workspace_path() / "app.py").write_text("x = 2\n")
    grade = graders.grade(coding, FinalAct(1, "done", fingerprint(coding)), PASSED)
    assert (grade.outcome, grade.verified, grade.review) == ("done", False, True)
    assert "misconfigured" in grade.reasons[0]


def test_a_judge_model_with_no_price_cannot_be_saved_in_admin(admin_client, admin_user, make_instance, price):
    from django.urls import reverse

    instance = make_instance(admin_user, name="judged")
    form = {"instance": instance.pk, "judge": "true", "judge_criteria": "", "response_pattern": "",
            "response_schema": "null", "sample_percent": "", "expects_changes": "unknown"}
    page = admin_client.post(reverse("admin:reviews_grading_add"), {**form, "judge_model": "claude-unpriced-9"})
    assert page.status_code == 200  # the form again, with the error on the field
    assert "claude-unpriced-9" in page.content.decode() and "has no price" in page.content.decode()
    assert not Grading.objects.exists()
    saved = admin_client.post(reverse("admin:reviews_grading_add"), {**form, "judge_model": price.model})
    assert saved.status_code == 302 and Grading.objects.get().judge_model == price.model


# --- a response schema never fetches anything ----------------------------------------------------------


@pytest.fixture
def listener():
    """A local HTTP server that serves a secret JSON document and records every request it gets."""
    import http.server
    import threading

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = b'{"type": "string", "description": "SECRET-INTERNAL-DOCUMENT"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", asked
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_stored_schema_with_a_remote_ref_is_never_fetched_and_the_grade_fails_cleanly(coding, listener):
    """Set on the instance directly (past every form): the grade goes to a person, the URL is never asked."""
    from instances.models import Instance

    url, asked = listener
    schema = {"type": "object", "properties": {"answer": {"$ref": url}}}
    Instance.objects.filter(pk=coding.instance_id).update(response_schema=schema)
    coding.instance.refresh_from_db()
    (coding.instance.workspace_path() / "app.py").write_text("x = 2\n")
    grade = graders.grade(coding, FinalAct(1, '{"answer": 5}', fingerprint(coding)), PASSED)
    assert asked == []
    assert (grade.outcome, grade.verified, grade.review) == ("done", False, True)
    assert "misconfigured" in grade.reasons[0] and "'$ref' starting with '#'" in grade.reasons[0]
    assert "SECRET-INTERNAL-DOCUMENT" not in repr(grade)


@pytest.mark.parametrize(
    ("base", "ref"), [("", "{url}"), ("", "{url}#/definitions/x"), ("{url}", "other.json")]
)
def test_the_graders_validator_resolves_no_ref_outside_the_schema(listener, base, ref):
    """Below the schema check, the validator's registry retrieves nothing: even an unchecked schema never fetches."""
    import referencing.exceptions

    url, asked = listener
    schema = {"properties": {"a": {"$ref": ref.format(url=url)}}} | ({"$id": url} if base else {})
    with pytest.raises(referencing.exceptions.Unresolvable):
        list(graders._validator(schema).iter_errors({"a": 5}))
    assert asked == []


def test_local_refs_still_resolve():
    schema = {
        "$defs": {"n": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}},
    }
    assert check_response('{"a": 1}', schema=schema, pattern="").passed
    failed = check_response('{"a": "x"}', schema=schema, pattern="")
    assert not failed.passed and "not of type 'integer'" in failed.detail
