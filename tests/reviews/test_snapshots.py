"""Workspace snapshots: the diff a reviewer reads is what the run changed, and nothing else."""

import os
import subprocess
import time

import pytest

from reviews import snapshots
from reviews.models import WorkspaceSnapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(user, make_instance, start):
    inst = make_instance(user)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True)
    (workspace / "app.py").write_text("def answer():\n    return 41\n")
    (workspace / "notes.txt").write_text("keep me\n")
    (workspace / "old.txt").write_text("delete me\n")
    return start(inst)


def test_the_diff_shows_changed_new_and_deleted_files(run):
    snap = snapshots.take(run)
    assert snap.method == "git" and snap.start_tree and snap.start_fingerprint
    workspace = run.instance.workspace_path()
    (workspace / "app.py").write_text("def answer():\n    return 42\n")
    (workspace / "new.py").write_text("print('hi')\n")
    (workspace / "old.txt").unlink()

    live = snapshots.diff(run)
    snapshots.finish(run)
    (workspace / "after_the_run.txt").write_text("not part of the run\n")
    text = snapshots.diff(run)

    assert live == text
    assert "-    return 41" in text and "+    return 42" in text
    assert "new.py" in text and "+print('hi')" in text
    assert "old.txt" in text and "-delete me" in text
    assert "notes.txt" not in text
    assert "after_the_run.txt" not in text
    assert "3 files changed" in text


def test_an_unchanged_workspace_has_an_empty_diff_and_equal_fingerprints(run):
    snapshots.take(run)
    snap = snapshots.finish(run)
    assert snapshots.diff(run) == ""
    assert snap.start_fingerprint == snap.end_fingerprint


def test_take_keeps_the_first_snapshot(run):
    first = snapshots.take(run)
    (run.instance.workspace_path() / "app.py").write_text("changed\n")
    second = snapshots.take(run)
    assert second.pk == first.pk and second.start_tree == first.start_tree
    assert WorkspaceSnapshot.objects.filter(run=run).count() == 1


def test_the_workspace_repository_is_left_alone_and_its_head_recorded(run):
    workspace = run.instance.workspace_path()
    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(workspace), "PATH": "/usr/bin:/bin"}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(workspace)]
    subprocess.run([*git, "init", "-q"], check=True, env=env)
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "start"], check=True, env=env)
    (workspace / ".gitignore").write_text("build/\n")
    (workspace / "build").mkdir()
    (workspace / "build" / "out.bin").write_text("artifact\n")
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, env=env, capture_output=True, text=True).stdout.strip()
    status_before = subprocess.run([*git, "status", "--porcelain"], env=env, capture_output=True, text=True).stdout

    snap = snapshots.take(run)
    (workspace / "app.py").write_text("def answer():\n    return 42\n")
    snapshots.finish(run)

    assert snap.workspace_head == head
    text = snapshots.diff(run)
    assert "+    return 42" in text
    assert "build/out.bin" not in text and ".git/" not in text
    status_after = subprocess.run([*git, "status", "--porcelain"], env=env, capture_output=True, text=True).stdout
    assert status_after.replace(" M app.py\n", "") == status_before


def test_a_workspace_too_large_gets_a_fingerprint_and_a_reason(run, settings):
    settings.TETHER_SNAPSHOT_MAX_FILES = 2
    snap = snapshots.take(run)
    assert snap.method == "none" and snap.start_fingerprint
    assert "more than 2 files" in snapshots.diff(run)


def test_no_snapshot_is_said_plainly(run):
    assert "no snapshot" in snapshots.diff(run)
    assert snapshots.start_fingerprint(run) == ""
    assert snapshots.finish(run) is None


def test_a_long_diff_is_cut(run):
    snapshots.take(run)
    (run.instance.workspace_path() / "big.txt").write_text("line\n" * 5000)
    text = snapshots.diff(run, max_chars=1000)
    assert len(text) < 1200 and "diff cut at 1,000 characters" in text


@pytest.mark.django_db(transaction=True)
def test_a_deleted_runs_snapshots_go_with_it(run):
    snapshots.take(run)
    path = snapshots.git_dir(run.pk)
    assert path.is_dir()
    run.delete()
    assert not path.exists()


def _git_tree(gitdir, workspace, hidden=()):
    """The tree git itself stores for `workspace` in `gitdir` (what `snapshots` stored before libgit2),
    from an index of its own: every file read afresh, nothing taken from the index libgit2 wrote;
    `hidden`, the files `.gitignore` hides, added with `--force` (a snapshot keeps them too)."""
    env = {
        "GIT_DIR": str(gitdir), "GIT_WORK_TREE": str(workspace), "PATH": "/usr/bin:/bin", "HOME": str(gitdir),
        "GIT_INDEX_FILE": str(gitdir / f"git-index-{os.getpid()}-{time.monotonic_ns()}"),
    }
    git = ["git", "-c", "core.autocrlf=false", "-c", "advice.addEmbeddedRepo=false"]
    subprocess.run([*git, "add", "--all"], cwd=workspace, env=env, check=True, capture_output=True)
    if hidden:
        subprocess.run([*git, "add", "--force", *hidden], cwd=workspace, env=env, check=True, capture_output=True)
    return subprocess.run([*git, "write-tree"], cwd=workspace, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_a_tree_stored_in_process_is_the_tree_git_stores(run, tmp_path):
    workspace = run.instance.workspace_path()
    (workspace / "run.sh").write_text("echo hi\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "link").symlink_to("app.py")
    (workspace / "crlf.txt").write_bytes(b"a\r\nb\n")
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "mod.py").write_text("x = 1\n")
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "debug.log").write_text("noise\n")
    (workspace / "node_modules").mkdir()
    (workspace / "node_modules" / "dep.js").write_text("skipped\n")

    snap = snapshots.take(run)
    gitdir = snapshots.git_dir(run.pk)
    assert snap.start_tree == _git_tree(gitdir, workspace, ["debug.log"])
    listed = subprocess.run(
        ["git", "--git-dir", str(gitdir), "ls-tree", "-r", snap.start_tree], check=True, capture_output=True, text=True
    ).stdout
    assert "100755 blob" in listed and "120000 blob" in listed and "pkg/mod.py" in listed
    assert "debug.log" in listed and "node_modules" not in listed  # what .gitignore hides is kept; caches are not

    (workspace / "app.py").write_text("changed\n")
    snapshots.mark_iteration(run, 2)  # the index's stat cache: a changed file is read again
    marked = (gitdir / "refs" / "tether" / "iteration-2").read_text().strip()
    assert marked == _git_tree(gitdir, workspace, ["debug.log"]) != snap.start_tree


def test_a_workspace_holding_another_repository_is_still_snapshot(run):
    """libgit2 refuses a clone inside the workspace; git itself stores it (as a gitlink)."""
    workspace = run.instance.workspace_path()
    inner = workspace / "vendor"
    inner.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(inner), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q"], cwd=inner, env=env, check=True)
    (inner / "lib.py").write_text("v = 1\n")
    subprocess.run(["git", "add", "lib.py"], cwd=inner, env=env, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1"], cwd=inner, env=env, check=True
    )
    snap = snapshots.take(run)
    assert snap.method == "git" and snap.start_tree, snap.note
    (workspace / "app.py").write_text("def answer():\n    return 42\n")
    assert "+    return 42" in snapshots.diff(run)
