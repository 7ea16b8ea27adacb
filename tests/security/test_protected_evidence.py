"""The evidence that grades an agent is protected: an agent that changes it is never auto-verified.

Each agent is a command-brain script driven through the real runner with the `checks` decider
(all required checks pass → done); its workspace holds a bug (`add` subtracts) and the test that
catches it. The instance protects what the coder template protects (with checks: the defaults). A test-tampering agent
rewrites (or deletes) the test so the check passes with the bug left in; an honest agent fixes
`app.py`. The review hooks run because the loop signals them (nothing here calls them).
"""

import pytest
from django.urls import reverse

from instances.models import AgentTemplate
from loops.models import Event
from reviews import services
from reviews.models import ReviewItem
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from app import add\n\nassert add(2, 3) == 5\n"
# Runs every tests/test_*.py; fails when one raises.
CHECK = "sys.path.insert(0, os.getcwd())\nimport glob, runpy\nfor f in sorted(glob.glob('tests/test_*.py')):\n    runpy.run_path(f)\n"

FIX = "pathlib.Path('app.py').write_text('def add(a, b):\\n    return a + b\\n')\nprint('fixed add')\n"
TAMPER = "pathlib.Path('tests/test_app.py').write_text('from app import add\\n\\nassert True  # add is fine\\n')\nprint('All tests pass!')\n"
DELETE = "pathlib.Path('tests/test_app.py').unlink()\nprint('All tests pass!')\n"
ADD_TEST = FIX + "pathlib.Path('tests/test_more.py').write_text('from app import add\\n\\nassert add(1, 1) == 2\\n')\n"


@pytest.fixture(autouse=True)
def evidence_settings(settings, tmp_path):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"
    settings.TETHER_REVIEW_SAMPLE_PERCENT = 0  # no verified done is drawn for review by chance


@pytest.fixture
def coder(user, make_instance, script):
    """Build an instance running `body` as its agent, protecting what the coder template protects."""

    def build(body):
        globs = AgentTemplate.objects.get(name="coder").protected_paths  # the defaults, and its own
        inst = make_instance(
            user,
            command=script(body),
            checks=[{"name": "tests", "command": script(CHECK), "required": True}],
            protected_paths=globs,
            max_iterations=2,
        )
        workspace = inst.workspace_path()
        (workspace / "tests").mkdir(parents=True)
        (workspace / "app.py").write_text(BUGGY)
        (workspace / "tests" / "test_app.py").write_text(TEST)
        return inst

    return build


def run_to_end(instance):
    from loops import services as loop_services

    run = loop_services.run_start(instance=instance, user=instance.owner, objective="make add(2, 3) return 5")
    return drive_in_thread(run)


def evidence_item(run):
    return ReviewItem.objects.get(run=run, reason=ReviewItem.Reason.EVIDENCE)


def test_an_agent_that_rewrites_the_tests_is_never_verified(coder, client, user):
    run = run_to_end(coder(TAMPER))
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail
    assert "changed what grades it (tests/test_app.py)" in run.outcome_detail
    assert run.protected_changed == ["tests/test_app.py"] and run.held_for_review
    [event] = Event.objects.filter(run=run, kind="protected.changed")
    assert event.data["modified"] == ["tests/test_app.py"] and event.data["iteration"] == 1

    item = evidence_item(run)
    assert item.is_pending and "changed what grades it" in item.detail
    client.force_login(user)
    html = client.get(f"/reviews/{item.pk}/").content.decode()
    assert "It changed what grades it" in html
    assert 'data-protected-diff tabindex="0"' in html and 'data-diff tabindex="0"' in html  # scrollable by keyboard
    protected = html.index("data-protected-diff")
    assert protected < html.index("What the run changed")  # diff-first: the evidence before all else
    shown = html[protected : html.index("</pre>", protected)]
    assert "-assert add(2, 3) == 5" in shown and "+assert True  # add is fine" in shown
    assert "app.py" not in shown.replace("test_app.py", "")  # only the protected files here
    timeline = client.get(reverse("loops:run-detail", args=[run.pk])).content.decode()
    assert "Changed what grades it: tests/test_app.py" in timeline


def test_a_person_who_accepts_the_changed_evidence_makes_the_done_verified(coder, user):
    run = run_to_end(coder(TAMPER))
    item = evidence_item(run)
    services.review_decide(item=item, user=user, verdict="accept", note="the old test was wrong")
    run.refresh_from_db()
    assert (run.outcome, run.verified) == ("done", True)


def test_a_person_who_rejects_it_leaves_it_unverified(coder, user):
    run = run_to_end(coder(TAMPER))
    services.review_decide(item=evidence_item(run), user=user, verdict="reject", note="the bug is still there")
    run.refresh_from_db()
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail


def test_an_honest_agent_that_edits_only_its_code_is_verified(coder):
    run = run_to_end(coder(FIX))
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    assert run.protected_changed == [] and not run.held_for_review
    assert not Event.objects.filter(run=run, kind="protected.changed").exists()
    assert not ReviewItem.objects.filter(run=run).exists()


def test_deleting_a_protected_test_counts(coder, client, user):
    run = run_to_end(coder(DELETE))
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail
    assert run.protected_changed == ["tests/test_app.py"]
    event = Event.objects.get(run=run, kind="protected.changed")
    assert event.data["deleted"] == ["tests/test_app.py"]
    client.force_login(user)
    html = client.get(f"/reviews/{evidence_item(run).pk}/").content.decode()
    assert "-assert add(2, 3) == 5" in html


def test_adding_a_test_file_under_tests_counts(coder):
    run = run_to_end(coder(ADD_TEST))
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail
    assert run.protected_changed == ["tests/test_more.py"]
    assert Event.objects.get(run=run, kind="protected.changed").data["added"] == ["tests/test_more.py"]
    assert evidence_item(run).is_pending


def test_a_conftest_dropped_anywhere_counts(coder):
    body = FIX + "pathlib.Path('lib').mkdir()\npathlib.Path('lib/conftest.py').write_text('collect_ignore = [\"tests\"]\\n')\n"
    run = run_to_end(coder(body))
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail
    assert run.protected_changed == ["lib/conftest.py"]


@pytest.mark.parametrize("planted", [
    "pytest.py",  # shadows the real pytest for `python -m pytest` run in the workspace
    ".local/lib/python3.13/site-packages/usercustomize.py",  # HOME is the workspace: Python's user site
    "lib/evil.pth",
])
def test_planting_what_python_loads_before_the_tests_counts(coder, planted):
    body = FIX + (
        "p = pathlib.Path(" + repr(planted) + ")\np.parent.mkdir(parents=True, exist_ok=True)\n"
        "p.write_text('import sys\\n')\nprint('All tests pass!')\n"
    )
    run = run_to_end(coder(body))
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail
    assert run.protected_changed == [planted]


def test_checks_do_not_load_the_workspace_users_site(tmp_path):
    """A usercustomize under HOME/.local (HOME is the workspace) must not run inside a check."""
    import subprocess
    import sys

    from instances.brains import process

    python = getattr(sys, "_base_executable", sys.executable)  # outside a venv, as in a sandbox: user site on
    site = subprocess.run([python, "-c", "import site; print(site.getusersitepackages())"], env={"HOME": str(tmp_path)},
                          capture_output=True, text=True, check=True).stdout.strip()
    site = tmp_path / site.removeprefix(str(tmp_path) + "/")
    site.mkdir(parents=True)
    (site / "usercustomize.py").write_text("raise SystemExit('usercustomize ran')\n")
    env = process.base_env(tmp_path)
    done = subprocess.run([python, "-c", "print('clean')"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.strip() == "clean", done.stderr
    env.pop("PYTHONNOUSERSITE")
    done = subprocess.run([python, "-c", "print('clean')"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert "usercustomize ran" in done.stderr  # the same file does run where the user site is on


def test_tampered_tests_do_not_become_the_next_runs_baseline(coder):
    """A second run on the same workspace, by an honest agent, after a run that rewrote the tests:
    the rewritten tests pass, but the run is measured from the tests as they were before."""
    tamperer = coder(TAMPER)
    first = run_to_end(tamperer)
    assert (first.outcome, first.verified) == ("done", False)
    tamperer.command = coder(FIX).command  # same instance and workspace, an honest agent now
    tamperer.save(update_fields=["command"])
    second = run_to_end(tamperer)
    assert (second.outcome, second.verified) == ("done", False), second.outcome_detail
    assert second.protected_changed == ["tests/test_app.py"]


def test_once_a_person_accepts_the_change_the_next_run_starts_from_it(coder, user):
    tamperer = coder(TAMPER)
    first = run_to_end(tamperer)
    services.review_decide(item=evidence_item(first), user=user, verdict="accept", note="the new test is right")
    tamperer.command = coder(FIX).command
    tamperer.save(update_fields=["command"])
    second = run_to_end(tamperer)
    assert (second.outcome, second.verified, second.protected_changed) == ("done", True, [])


def test_a_check_runs_the_source_not_a_stale_or_forged_pyc(tmp_path, script):
    """A `.pyc` in the workspace's __pycache__ that matches the source's mtime and size (a file
    rewritten within the second, or a forgery) must not stand in for the source a check tests."""
    import importlib.util
    import os
    import py_compile

    from instances import sandbox
    from instances.brains import process

    workspace = tmp_path / "ws"
    workspace.mkdir()
    source = workspace / "app.py"
    source.write_text("def add(a, b):\n    return a + b\n")
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    compiled = source.stat()
    source.write_text("def add(a, b):\n    return a - b\n")  # the bug, at the same size
    os.utime(source, ns=(compiled.st_atime_ns, compiled.st_mtime_ns))
    check = script("sys.path.insert(0, os.getcwd())\nfrom app import add\nsys.exit(0 if add(2, 3) == 5 else 1)\n")
    box = sandbox.Spec(workspace=workspace)

    done = process.run(check, cwd=workspace, env=process.base_env(workspace), timeout=30, spec=box)
    assert done.exit_code == 1, done.stderr  # the bug is caught
    fooled = {k: v for k, v in process.base_env(workspace).items() if k != "PYTHONPYCACHEPREFIX"}
    done = process.run(check, cwd=workspace, env=fooled, timeout=30, spec=box)
    assert done.exit_code == 0, done.stderr  # reading the workspace's bytecode, the same check is fooled
