"""Protected paths: which files they cover, how a change is seen, and the one verdict on a done."""

import os

import pytest

from instances import protected
from loops import policy
from loops.decision import Decision

CODER = ["tests/**", "test_*.py", "*_test.py", "conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"]


@pytest.mark.parametrize(
    ("path", "covered"),
    [
        ("tests/test_app.py", True),
        ("tests/unit/deep/data.json", True),
        ("test_app.py", True),
        ("pkg/sub/test_app.py", True),  # a glob without "/" matches a name in any directory
        ("pkg/app_test.py", True),
        ("conftest.py", True),
        ("lib/conftest.py", True),
        ("pyproject.toml", True),
        ("app.py", False),
        ("pkg/tests/helper.py", False),  # "tests/**" is anchored at the workspace root
        ("testsuite/x.py", False),
        ("docs/testing.md", False),
    ],
)
def test_the_coder_globs_cover_the_test_suite_and_its_configuration(path, covered):
    assert protected.matches(path, CODER) is covered


def test_glob_spellings():
    assert protected.matches("spec/a.rb", ["./spec/**"])
    assert protected.matches("spec/a.rb", ["/spec/**"])
    assert protected.matches("x/tests/a.py", ["tests/"])  # a bare directory name, anywhere
    assert not protected.matches("tests", ["tests/"])
    assert not protected.matches("a.py", ["", "  "])


def test_compare_names_modified_added_and_deleted():
    before = {"tests/a.py": "1", "tests/b.py": "2", "conftest.py": "3"}
    after = {"tests/a.py": "1", "tests/b.py": "X", "tests/c.py": "4"}
    changes = protected.compare(before, after)
    assert changes == protected.Changes(modified=("tests/b.py",), added=("tests/c.py",), deleted=("conftest.py",))
    assert changes.paths == ("conftest.py", "tests/b.py", "tests/c.py")
    assert not protected.compare(before, dict(before))


def test_compare_counts_only_what_the_globs_protect_now():
    before = {"tests/a.py": "1", "setup.cfg": "2"}
    after = {"tests/a.py": "1", "setup.cfg": "9", "extra/x.py": "3"}
    assert not protected.compare(before, after, ["tests/**"])


def test_digests_see_contents_links_and_special_files_without_opening_them(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("assert 1\n")
    (tmp_path / "tests" / "__pycache__").mkdir()
    (tmp_path / "tests" / "__pycache__" / "test_a.pyc").write_bytes(b"x")
    (tmp_path / "app.py").write_text("x = 1\n")
    os.mkfifo(tmp_path / "tests" / "pipe")  # opening it would block the worker
    before = protected.digests(tmp_path, CODER)
    assert sorted(before) == ["tests/pipe", "tests/test_a.py"]

    (tmp_path / "tests" / "test_a.py").unlink()
    (tmp_path / "tests" / "test_a.py").symlink_to(tmp_path / "app.py")
    assert protected.compare(before, protected.digests(tmp_path, CODER)).modified == ("tests/test_a.py",)


def test_a_workspace_that_outgrows_the_limits_counts_as_changed(tmp_path, monkeypatch):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("assert 1\n")
    before = protected.digests(tmp_path, CODER)
    monkeypatch.setattr(protected, "MAX_WALKED", 3)
    for n in range(5):
        (tmp_path / f"junk{n}.txt").write_text("")
    assert protected.TRUNCATED in protected.compare(before, protected.digests(tmp_path, CODER)).added


# --- the one verdict -----------------------------------------------------------------------------------

STATE = policy.State(iteration=1, max_iterations=3, act_ok=True, has_checks=True)
DONE = Decision("done", "fixed it")
PASSED = [policy.Check("tests", True, True)]


def test_a_done_that_changed_protected_paths_is_never_verified():
    step = policy.verdict(STATE, DONE, PASSED, protected_changed=["tests/test_app.py"])
    assert step == policy.Stop("done", step.detail, verified=False, held_for_review=True)
    assert "changed what grades it (tests/test_app.py)" in step.detail
    assert policy.next_step(STATE, DONE, PASSED, protected_changed=["tests/test_app.py"]) == step


def test_held_for_review_only_when_everything_else_verified_it():
    doubt = policy.Assessment(verified=False, reasons=("the judge asks for a person",))
    step = policy.verdict(STATE, DONE, PASSED, [doubt], protected_changed=["conftest.py"])
    assert (step.verified, step.held_for_review) == (False, False)
    assert "the judge asks for a person" in step.detail


def test_without_changed_evidence_checks_and_graders_decide():
    assert policy.verdict(STATE, DONE, PASSED) == policy.Stop("done", policy.verdict(STATE, DONE, PASSED).detail, verified=True)
    assert policy.verdict(STATE, DONE, PASSED, [policy.Assessment(outcome="retry", verified=False, instruction="again")]) == policy.Continue("again")
    failed = policy.verdict(STATE, DONE, PASSED, [policy.Assessment(outcome="failed", verified=False, reasons=("bad answer",))])
    assert failed == policy.Stop("failed", "bad answer")
    failing = [policy.Check("tests", True, False, "1 failed")]
    assert isinstance(policy.verdict(STATE, DONE, failing, protected_changed=["tests/x.py"]), policy.Continue)


def test_changed_evidence_does_not_touch_other_verdicts():
    for said in ("continue", "failed", "escalate"):
        decision = Decision(said, "why", "next step")
        assert policy.next_step(STATE, decision, PASSED, protected_changed=["tests/a.py"]) == policy.next_step(
            STATE, decision, PASSED
        )
