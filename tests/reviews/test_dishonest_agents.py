"""Scripted agents that exit cleanly with wrong results never end done (verified); honest ones do.

Each agent is a command-brain script; the `llm` decider and the judge are Claude, played by the
local Messages-API server; the decider always reports done (it believes the agent). Runs go
through the real runner, which signals the review hooks (the start snapshot, the graders when the
policy would say done, the review queue after the finish); nothing here calls them.
"""

import json
from dataclasses import dataclass

import pytest

from loops import services as loop_services
from reviews.models import Grading, ReviewItem
from tests.loops.conftest import drive_in_thread
from tests.reviews.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

APP = "def add(a, b):\n    return a + b\n"
SCHEMA = {
    "type": "object",
    "required": ["summary", "files_changed"],
    "properties": {"summary": {"type": "string"}, "files_changed": {"type": "array", "items": {"type": "string"}}},
}


@dataclass
class Ended:
    outcome: str
    verified: bool | None
    review: list[str]
    detail: str

    @property
    def done_verified(self):
        return self.outcome == "done" and self.verified is True


@pytest.fixture
def agent(user, make_instance, script, server, claude, credential, price):
    """Build an instance: a scripted command agent, the llm decider, checks, optional grading."""

    def build(body, *, checks=(), grading=None, judge=None):
        inst = make_instance(
            user,
            command=script(body),
            decider="llm",
            base_url=server.url,
            credential=credential,
            model=MODEL,
            checks=[{"name": name, "command": script(code), "required": required} for name, code, required in checks],
            max_iterations=2,
        )
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        (inst.workspace_path() / "app.py").write_text(APP)
        if grading:
            Grading.objects.create(instance=inst, **grading)
        if judge:
            claude.judge = judge
        return inst

    return build


def graded_run(instance, objective="add a mul(a, b) function to app.py"):
    """Run `instance` to its end through the runner (and the review hooks it signals); return how it ended."""
    run = drive_in_thread(loop_services.run_start(instance=instance, user=instance.owner, objective=objective))
    review = sorted(ReviewItem.objects.filter(run=run).exclude(reason="sampled").values_list("reason", flat=True))
    return Ended(run.outcome, run.verified, review, run.outcome_detail)


def assert_caught(ended):
    assert not ended.done_verified, ended
    assert ended.outcome == "failed" or ended.review, ended


def assert_honest(ended):
    assert ended.done_verified, ended
    assert ended.review == [], ended


# --- claims done while the tests fail --------------------------------------------------------------

TESTS_MUL = ("tests", "sys.path.insert(0, os.getcwd())\nfrom app import mul\nsys.exit(0 if mul(3, 4) == 12 else 1)\n", True)


def test_claims_done_while_the_tests_fail(agent):
    wrong = "pathlib.Path('app.py').write_text(pathlib.Path('app.py').read_text() + 'def mul(a, b):\\n    return a + b\\n')\nprint('Added mul. All tests pass!')\n"
    ended = graded_run(agent(wrong, checks=[TESTS_MUL]))
    assert_caught(ended)
    assert ended.outcome == "failed" and "required checks fail: tests" in ended.detail
    assert ended.review == ["failed"]


def test_honest_fix_with_passing_tests(agent):
    right = "pathlib.Path('app.py').write_text(pathlib.Path('app.py').read_text() + 'def mul(a, b):\\n    return a * b\\n')\nprint('Added mul.')\n"
    assert_honest(graded_run(agent(right, checks=[TESTS_MUL])))


# --- claims done with no change ----------------------------------------------------------------------

COMPILES = ("compiles", "import py_compile\npy_compile.compile('app.py', doraise=True)\n", True)


def test_claims_done_with_no_change(agent):
    ended = graded_run(agent("print('I added mul(a, b) to app.py and tested it.')\n", checks=[COMPILES]))
    assert_caught(ended)
    assert ended.outcome == "done" and ended.verified is False
    assert "claimed done, changed nothing" in ended.detail
    assert ended.review == ["unverified"]


def test_honest_change_that_compiles(agent):
    body = "pathlib.Path('app.py').write_text(pathlib.Path('app.py').read_text() + 'def mul(a, b):\\n    return a * b\\n')\n"
    assert_honest(graded_run(agent(body, checks=[COMPILES])))


# --- a well-formed answer that violates the response schema -----------------------------------------------

EDIT = "pathlib.Path('app.py').write_text(pathlib.Path('app.py').read_text() + 'def mul(a, b):\\n    return a * b\\n')\n"


def test_a_well_formed_answer_that_violates_the_response_schema(agent):
    answer = json.dumps({"summary": "Added mul.", "files_changed": "app.py"})
    inst = agent(EDIT + f"print({answer!r})\n", checks=[COMPILES], grading={"response_schema": SCHEMA})
    ended = graded_run(inst)
    assert_caught(ended)
    assert "not of type 'array'" in ended.detail


def test_honest_answer_in_the_response_schema(agent):
    answer = json.dumps({"summary": "Added mul.", "files_changed": ["app.py"]})
    inst = agent(EDIT + f"print({answer!r})\n", checks=[COMPILES], grading={"response_schema": SCHEMA})
    assert_honest(graded_run(inst))


# --- an answer the judge rejects --------------------------------------------------------------------------


def test_an_answer_the_judge_rejects(agent, server):
    body = "pathlib.Path('app.py').write_text(pathlib.Path('app.py').read_text() + 'def mul(a, b):\\n    return 12\\n')\nprint('Added mul.')\n"
    inst = agent(body, checks=[COMPILES], grading={"judge": True}, judge=("fail", ["mul returns a constant 12"]))
    ended = graded_run(inst)
    assert_caught(ended)
    assert "mul returns a constant 12" in ended.detail


def test_an_answer_the_judge_passes(agent, claude):
    inst = agent(EDIT + "print('Added mul.')\n", checks=[COMPILES], grading={"judge": True}, judge=("pass", ["mul multiplies"]))
    assert_honest(graded_run(inst))
    assert claude.judged == 1


def test_a_judgment_call_goes_to_a_person(agent):
    inst = agent(EDIT + "print('Added mul.')\n", checks=[COMPILES], grading={"judge": True}, judge=("needs-human", ["naming is a matter of taste"]))
    ended = graded_run(inst)
    assert_caught(ended)
    assert ended.outcome == "done" and ended.verified is False
    assert ended.review == ["needs_human"]


# --- a partial fix that passes a weak check but not the required one -------------------------------------

WEAK = ("lint", "import py_compile\npy_compile.compile('app.py', doraise=True)\n", False)
BOTH = ("tests", "sys.path.insert(0, os.getcwd())\nfrom app import mul, sub\nsys.exit(0 if (mul(3, 4), sub(3, 4)) == (12, -1) else 1)\n", True)


def test_a_partial_fix_passing_the_weak_check_but_not_the_required_one(agent):
    ended = graded_run(agent(EDIT + "print('Added mul and sub.')\n", checks=[WEAK, BOTH]))
    assert_caught(ended)
    assert ended.outcome == "failed" and "tests" in ended.detail


def test_honest_full_fix(agent):
    body = "pathlib.Path('app.py').write_text(pathlib.Path('app.py').read_text() + 'def mul(a, b):\\n    return a * b\\n\\ndef sub(a, b):\\n    return a - b\\n')\n"
    assert_honest(graded_run(agent(body, checks=[WEAK, BOTH])))
