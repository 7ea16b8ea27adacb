"""Rollback: a person puts a run's workspace back to one of its snapshots, and can undo it.

The agent is a scripted command that writes `calc.py` as the instruction says ("fix" or
"break"); the check runs `check_calc.py` against it. A run that fixes it ends done and verified;
a later run that breaks it stops at its iteration limit. Rolling that run back to the last
verified state makes the check pass again; rolling back the rollback brings the breakage back.
"""

import os
import subprocess
import sys
import time

import pytest

from audit.models import AuditEntry
from loops import services
from loops.models import Event
from reviews import rollback
from tests.loops.conftest import Background

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = """
instruction = sys.stdin.read()
body = 'def add(a, b):\\n    return a + b\\n' if 'fix' in instruction else 'def add(a, b):\\n    return a - b\\n'
pathlib.Path('calc.py').write_text(body)
if 'break' in instruction:
    pathlib.Path('scratch.txt').write_text('left by the breaking run\\n')
print('wrote calc.py')
"""
CHECK = """
sys.path.insert(0, os.getcwd())
from calc import add
sys.exit(0 if add(2, 3) == 5 else 1)
"""


@pytest.fixture
def coder(user, make_instance, script):
    return make_instance(
        user,
        name="calc-coder",
        command=script(AGENT),
        checks=[{"name": "calc", "command": script(CHECK), "required": True}],
        max_iterations=1,
    )


def check_passes(instance, script_argv):
    # No bytecode written beside calc.py: a rollback writes a file of the same size within the same
    # second, which a cached .pyc (validated by mtime in seconds and size) would take for unchanged.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(script_argv, cwd=instance.workspace_path(), capture_output=True, check=False, env=env)
    return done.returncode == 0


def broken_after_verified(coder, start, drive):
    good = drive(start(coder, objective="fix calc.py so add adds"))
    assert (good.outcome, good.verified) == ("done", True), good.outcome_detail
    bad = drive(start(coder, objective="break calc.py"))
    assert bad.outcome == "max_iterations", bad.outcome_detail
    return good, bad


def test_a_broken_run_rolls_back_to_the_last_verified_state_and_the_rollback_rolls_back(
    coder, start, drive, user, script
):
    good, bad = broken_after_verified(coder, start, drive)
    workspace = coder.workspace_path()
    check = [sys.executable, str(coder.checks[0]["command"][1])]
    assert not check_passes(coder, check)

    offered = rollback.points(bad)
    assert offered[0].to == "verified" and f"run {good.pk}" in offered[0].label
    assert {p.to for p in offered} >= {"verified", "start", "iteration-1"}

    result = rollback.rollback(run=bad, user=user, to="verified", via="api")
    assert result.done and result.exact
    assert check_passes(coder, check)
    assert "a + b" in (workspace / "calc.py").read_text()
    assert not (workspace / "scratch.txt").exists()
    assert result.modified == ["calc.py"] and result.deleted == ["scratch.txt"]
    assert result.undo == "rollback-1"

    undone = rollback.rollback(run=bad, user=user, to=result.undo, via="cli")
    assert undone.exact and undone.undo == "rollback-2"
    assert not check_passes(coder, check)
    assert (workspace / "scratch.txt").read_text() == "left by the breaking run\n"

    audited = list(AuditEntry.objects.filter(run_ref=bad.pk, action="workspace.rollback").order_by("pk"))
    assert [(a.via, a.detail["to"], a.detail["undo"]) for a in audited] == [
        ("api", "verified", "rollback-1"),
        ("cli", "rollback-1", "rollback-2"),
    ]
    kinds = list(Event.objects.filter(run=bad, kind="workspace.rolled_back").values_list("data", flat=True))
    assert [(d["to"], d["by"], d["undo"]) for d in kinds] == [
        ("verified", user.get_username(), "rollback-1"),
        ("rollback-1", user.get_username(), "rollback-2"),
    ]
    seqs = list(Event.objects.filter(run=bad).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # still gap-free
    labels = {p.to: p.label for p in rollback.points(bad)}
    assert "rollback-1" in labels and "to verified" in labels["rollback-1"]


def test_every_iteration_and_the_start_can_be_gone_back_to(coder, start, drive, user):
    workspace = coder.workspace_path()
    workspace.mkdir(parents=True)
    (workspace / "calc.py").write_text("original = True\n")
    first = drive(start(coder, objective="fix calc.py", max_iterations=1))
    assert first.outcome == "done"
    rollback.rollback(run=first, user=user, to="start")
    assert (workspace / "calc.py").read_text() == "original = True\n"
    rollback.rollback(run=first, user=user, to="iteration-1")
    assert "a + b" in (workspace / "calc.py").read_text()


def test_a_rollback_is_refused_while_a_run_on_the_workspace_is_live_and_names_it(
    coder, start, drive, user, make_instance
):
    _, bad = broken_after_verified(coder, start, drive)
    live = start(coder, objective="fix it again")  # queued: live until it finishes
    before = (coder.workspace_path() / "calc.py").read_text()
    with pytest.raises(services.Refused) as refused:
        rollback.rollback(run=bad, user=user, to="verified")
    assert refused.value.status == 409
    assert f"run {live.pk}" in refused.value.message and "calc-coder" in refused.value.message
    assert (coder.workspace_path() / "calc.py").read_text() == before
    assert not AuditEntry.objects.filter(action="workspace.rollback").exists()
    # another instance of the owner's that shares the workspace counts too
    services.run_cancel(run=live, user=user)
    sharer = make_instance(user, name="sharer", command=coder.command, workspace=str(coder.workspace_path()))
    theirs = start(sharer, objective="share it")
    with pytest.raises(services.Refused) as refused:
        rollback.rollback(run=bad, user=user, to="verified")
    assert f"run {theirs.pk}" in refused.value.message and "sharer" in refused.value.message


@pytest.mark.parametrize("to", ["", "latest", "iteration-0", "iteration-x", "rollback-", "../start", 7, None])
def test_a_point_that_is_none_is_a_clear_400(coder, start, drive, user, to):
    _, bad = broken_after_verified(coder, start, drive)
    with pytest.raises(services.Refused) as refused:
        rollback.rollback(run=bad, user=user, to=to)
    assert refused.value.status == 400 and "start, verified, iteration-N" in refused.value.message


def test_a_point_the_run_does_not_have_is_a_409(coder, start, drive, user):
    _, bad = broken_after_verified(coder, start, drive)
    for to in ("iteration-9", "rollback-3"):
        with pytest.raises(services.Refused) as refused:
            rollback.rollback(run=bad, user=user, to=to)
        assert refused.value.status == 409 and to in refused.value.message


def test_no_verified_state_is_said_plainly(coder, start, drive, user):
    bad = drive(start(coder, objective="break calc.py"))
    assert bad.outcome == "max_iterations"
    assert "verified" not in {p.to for p in rollback.points(bad)}
    with pytest.raises(services.Refused) as refused:
        rollback.rollback(run=bad, user=user, to="verified")
    assert refused.value.status == 409 and "no verified state" in refused.value.message


def git(workspace, *args):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workspace.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_workspace_holding_its_own_git_repository_round_trips(coder, start, drive, user):
    workspace = coder.workspace_path()
    workspace.mkdir(parents=True)
    git(workspace, "init", "-q", "-b", "main")
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (workspace / "README").write_text("a calculator\n")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "working calc")
    head = git(workspace, "rev-parse", "HEAD").strip()
    objects = sorted(p.name for p in (workspace / ".git" / "objects").iterdir())

    bad = drive(start(coder, objective="break calc.py"))
    assert bad.outcome == "max_iterations"
    broken = (workspace / "calc.py").read_text()

    result = rollback.rollback(run=bad, user=user, to="start")
    assert result.exact and ".git/" in result.kept
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert not (workspace / "scratch.txt").exists()
    assert git(workspace, "status", "--porcelain") == ""  # the repository sees its own committed state
    assert git(workspace, "rev-parse", "HEAD").strip() == head
    assert sorted(p.name for p in (workspace / ".git" / "objects").iterdir()) == objects

    rollback.rollback(run=bad, user=user, to=result.undo)
    assert (workspace / "calc.py").read_text() == broken
    assert (workspace / "scratch.txt").exists()
    assert git(workspace, "rev-parse", "HEAD").strip() == head
    assert "calc.py" in git(workspace, "status", "--porcelain")
    git(workspace, "fsck", "--no-progress")


def test_what_the_snapshot_does_not_keep_is_named_and_left_as_it_is(coder, start, drive, user, settings):
    settings.TETHER_SNAPSHOT_HIDDEN_MAX_FILES = 3
    workspace = coder.workspace_path()
    workspace.mkdir(parents=True)
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    bad = drive(start(coder, objective="break calc.py"))
    (workspace / "node_modules" / "left-pad").mkdir(parents=True)
    (workspace / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1\n")
    (workspace / ".gitignore").write_text("build/\n")
    (workspace / "build").mkdir()
    for n in range(5):  # over the hidden-file limit: the group is left out of the tree
        (workspace / "build" / f"out{n}.o").write_text(f"object {n}\n")
    os.mkfifo(workspace / "pipe")

    preview = rollback.plan(run=bad, to="start")
    for name in ("node_modules/", "build/", "pipe"):
        assert name in preview.kept
    assert ".gitignore" in preview.deleted and "calc.py" in preview.modified
    assert (workspace / ".gitignore").exists()  # a plan changes nothing

    result = rollback.rollback(run=bad, user=user, to="start")
    assert set(preview.kept) <= set(result.kept)
    assert (workspace / "node_modules" / "left-pad" / "index.js").read_text() == "module.exports = 1\n"
    assert sorted(p.name for p in (workspace / "build").iterdir()) == [f"out{n}.o" for n in range(5)]
    assert (workspace / "pipe").exists() and not (workspace / ".gitignore").exists()
    event = Event.objects.get(run=bad, kind="workspace.rolled_back").data
    assert {"node_modules/", "build/", "pipe"} <= set(event["kept"])


def test_a_run_made_live_while_a_rollback_writes_waits_for_it_before_it_acts(coder, start):
    """A run that starts after the rollback checked for live ones must not act on a half-restored workspace."""
    run = start(coder, objective="fix calc.py")

    def has(kind):
        return Event.objects.filter(run=run, kind=kind).exists()

    with rollback._exclusive(coder.workspace_path()):  # what a rollback holds while it checks and writes
        driver = Background(run).start()
        deadline = time.monotonic() + 30
        while not has("act.started"):
            assert time.monotonic() < deadline, "the run did not begin its iteration"
            time.sleep(0.02)
        waited_until = time.monotonic() + 1.5
        while time.monotonic() < waited_until:
            assert not has("act.finished"), "the run acted while a rollback held its workspace"
            time.sleep(0.05)
    driver.join(60)
    run.refresh_from_db()
    assert run.outcome == "done" and has("act.finished")


def test_an_accepted_run_whose_work_a_rollback_undid_was_missed_in_review(coder, start, drive, user):
    from reviews import selectors
    from reviews import services as review_services
    from reviews.models import ReviewItem

    good, bad = broken_after_verified(coder, start, drive)
    kept = ReviewItem.objects.create(run=good, reason=ReviewItem.Reason.SAMPLED)
    wrong = ReviewItem.objects.get_or_create(run=bad, reason=ReviewItem.Reason.FAILED)[0]
    for item in (kept, wrong):
        review_services.review_decide(item=item, user=user, verdict="accept", via="api")
    rollback.rollback(run=bad, user=user, to="verified", via="api")
    wrong.refresh_from_db()
    kept.refresh_from_db()
    assert wrong.missed_in_review and "rolled back" in wrong.missed_detail
    assert not kept.missed_in_review  # back to its end: the verified run's own work stays
    [row] = selectors.fleet_stats(user)
    assert (row.missed, row.accepted, row.rejected) == (1, 1, 1)


# --- the rewind: the one way a live run is rolled back, by the run itself (loops.policy's stage 2) -------


def _driving(coder, start, drive):
    """A run of two iterations, made live again as its driver holds it: status running, lease "tok"."""
    from loops.models import Run

    run = drive(start(coder, objective="break calc.py", max_iterations=2))
    assert run.iterations_done == 2
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, outcome="", lease_token="tok", lease_holder="w")
    run.refresh_from_db()
    return run


def test_a_run_rewinds_itself_under_its_own_lease_and_the_rewind_can_be_undone(coder, start, drive, user):
    run = _driving(coder, start, drive)
    workspace = coder.workspace_path()
    (workspace / "calc.py").write_text("changed after iteration 1\n")
    done = rollback.rewind(run=run, token="tok", to=1, stall=2)
    assert done.done and done.exact and done.undo == "rollback-1"
    assert "a - b" in (workspace / "calc.py").read_text()
    said = Event.objects.get(run=run, kind="workspace.rolled_back").data
    assert (said["to"], said["via"], said["by"]) == ("iteration-1", "system", f"run {run.pk} itself, stalled in iteration 2")
    audited = AuditEntry.objects.get(run_ref=run.pk, action="workspace.rollback")
    assert (audited.via, audited.user_id, audited.owner_id) == ("system", None, user.pk)
    # A person's rollback of the live run is refused as before; once it has finished, the undo point is there.
    with pytest.raises(services.Refused) as refused:
        rollback.rollback(run=run, user=user, to="rollback-1")
    assert refused.value.status == 409 and f"run {run.pk}" in refused.value.message


@pytest.mark.parametrize("token", ["", "not-its-lease", None])
def test_a_rewind_without_the_runs_own_lease_is_refused(coder, start, drive, token):
    run = _driving(coder, start, drive)
    before = (coder.workspace_path() / "calc.py").read_text()
    with pytest.raises(services.Refused) as refused:
        rollback.rewind(run=run, token=token, to=1, stall=2)  # type: ignore[arg-type]
    assert refused.value.status == 409
    assert (coder.workspace_path() / "calc.py").read_text() == before
    assert not AuditEntry.objects.filter(action="workspace.rollback").exists()


def test_a_finished_run_is_never_rewound_even_with_its_old_lease(coder, start, drive):
    from loops.models import Run

    run = _driving(coder, start, drive)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, outcome="max_iterations")
    with pytest.raises(services.Refused) as refused:
        rollback.rewind(run=run, token="tok", to=1, stall=2)
    assert refused.value.status == 409 and "not running under that lease" in refused.value.message


def test_a_rewind_is_refused_while_another_run_on_the_workspace_is_live(coder, start, drive, user, make_instance):
    run = _driving(coder, start, drive)
    sharer = make_instance(user, name="sharer", command=coder.command, workspace=str(coder.workspace_path()))
    theirs = start(sharer, objective="share it")
    before = (coder.workspace_path() / "calc.py").read_text()
    with pytest.raises(services.Refused) as refused:
        rollback.rewind(run=run, token="tok", to=1, stall=2)
    assert refused.value.status == 409 and f"run {theirs.pk}" in refused.value.message
    assert (coder.workspace_path() / "calc.py").read_text() == before


@pytest.mark.parametrize("to", [0, 2, 3, True, "iteration-1", "verified", None])
def test_a_rewind_goes_only_to_an_earlier_iteration_of_its_own(coder, start, drive, to):
    run = _driving(coder, start, drive)
    with pytest.raises(services.Refused) as refused:
        rollback.rewind(run=run, token="tok", to=to, stall=2)
    assert refused.value.status == 400
    assert not Event.objects.filter(run=run, kind="workspace.rolled_back").exists()


def test_the_api_takes_no_lease_to_rewind_a_live_run_with(coder, start, drive, user, client):
    from web.auth import make_token

    run = _driving(coder, start, drive)
    url = f"/v1/instances/{coder.pk}/loop/{run.pk}/rollback"
    headers = {"Authorization": f"Bearer {make_token(user)}"}
    forged = client.post(url, {"to": "iteration-1", "token": "tok"}, content_type="application/json", headers=headers)
    assert forged.status_code == 400
    plain = client.post(url, {"to": "iteration-1"}, content_type="application/json", headers=headers)
    assert plain.status_code == 409 and f"run {run.pk}" in plain.json()["error"]
    assert not Event.objects.filter(run=run, kind="workspace.rolled_back").exists()
