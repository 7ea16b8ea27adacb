"""A run's workspace snapshot reads only the workspace, however its agent swaps things during it.

Tether (possibly root) stores the workspace as git trees for the review diff. An agent's
programs can exchange a directory of the workspace with a symlink to somewhere else while that
happens, swap the workspace itself for a symlink, or leave a FIFO where a file is read: none of
it may put a file from outside the workspace into a diff, or hang the worker.
"""

import ctypes
import os
import subprocess
import threading
import time

import pytest
from django.db import connection

from reviews import snapshots

pytestmark = pytest.mark.django_db

SECRET = "TOP-SECRET-0600-CONTENT"
AT_FDCWD, RENAME_EXCHANGE = -100, 2


@pytest.fixture(autouse=True)
def snapshot_settings(settings, tmp_path):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"


def start(instance):
    from loops import services

    return services.run_start(instance=instance, user=instance.owner, objective="change the workspace")


def private_file(path, text):
    """A file only its owner reads (another user's, when the tests run as root)."""
    path.write_text(text)
    path.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(path, 54321, 54321)
    return path


def all_objects(run):
    """Every object the run's shadow directory holds, as text."""
    done = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        env={"GIT_DIR": str(snapshots.git_dir(run.pk)), "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        capture_output=True, check=True,
    )  # fmt: skip
    return done.stdout.decode(errors="replace")


def test_a_directory_exchanged_with_a_symlink_never_brings_an_outside_file_in(user, make_instance, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    private_file(tmp_path / "root-only.txt", f"{SECRET} the file a link points at\n")
    inst = make_instance(user)
    workspace = inst.workspace_path()
    sub = workspace / "sub"
    sub.mkdir(parents=True)
    for n in range(40):  # the same names inside and outside: a path followed mid-read lands outside
        (sub / f"f{n}.txt").write_text(f"inside {n}\n")
        private_file(outside / f"f{n}.txt", f"{SECRET} {n}\n")
    private_file(outside / "secret.txt", f"{SECRET}\n")
    (workspace / "swap").symlink_to(outside)
    run = start(inst)
    snapshots.take(run)
    (workspace / "leak").symlink_to(tmp_path / "root-only.txt")

    libc = ctypes.CDLL(None, use_errno=True)
    a, b = str(sub).encode(), str(workspace / "swap").encode()
    stop, swaps = threading.Event(), [0]

    def exchange():
        while not stop.is_set():
            if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0:
                swaps[0] += 1

    swapper = threading.Thread(target=exchange, daemon=True)
    swapper.start()
    diffs, until = [], time.monotonic() + 3
    try:
        for number in range(30):
            snapshots.mark_iteration(run, number)
            diffs.append(snapshots.diff(run))
            if time.monotonic() > until:
                break
    finally:
        stop.set()
        swapper.join(5)
    snapshots.finish(run)
    diffs.append(snapshots.diff(run))

    assert swaps[0] > 100
    assert all(SECRET not in text for text in diffs)
    assert SECRET not in all_objects(run)
    final = diffs[-1]
    assert "leak" in final and "new file mode 120000" in final and str(tmp_path / "root-only.txt") in final


@pytest.mark.django_db(transaction=True)
def test_fifos_do_not_hang_a_snapshot(user, make_instance):
    inst = make_instance(user)
    workspace = inst.workspace_path()
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text("x = 1\n")
    (workspace / ".git").mkdir()
    fifos = [workspace / "pipe", workspace / ".gitignore", workspace / "src" / ".gitignore", workspace / ".git" / "HEAD"]
    for fifo in fifos:
        os.mkfifo(fifo)
    run = start(inst)
    results = {}

    def snapshot():
        try:
            results["take"] = snapshots.take(run)
            (workspace / "src" / "app.py").write_text("x = 2\n")
            results["live"] = snapshots.diff(run)
            results["finish"] = snapshots.finish(run)
            results["diff"] = snapshots.diff(run)
        finally:
            connection.close()

    worker = threading.Thread(target=snapshot, daemon=True)
    worker.start()
    worker.join(10)
    hung = worker.is_alive()
    for fifo in fifos:  # let a reader stuck in open() go (it then reads an empty file)
        for _ in range(50):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                break
    worker.join(40)
    assert not hung, "a snapshot blocked on a FIFO"
    assert results["take"].method == "git" and results["take"].start_tree
    assert results["finish"].end_tree
    assert results["live"] == results["diff"]
    assert "+x = 2" in results["diff"] and "pipe" not in results["diff"]


def git_write_tree(workspace, tmp_path):
    """The tree git itself stores for `workspace`, from a repository and index of its own (what
    `.gitignore` hides included: a snapshot keeps it, for the review)."""
    gitdir = tmp_path / "plain.git"
    env = {
        "GIT_DIR": str(gitdir), "GIT_WORK_TREE": str(workspace), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
    }  # fmt: skip
    git = ["git", "-c", "core.autocrlf=false"]
    subprocess.run([*git, "init", "-q", "--bare", str(gitdir)], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, check=True)
    subprocess.run([*git, "add", "-A", "--force"], cwd=workspace, env=env, check=True)  # .gitignore's files kept too
    done = subprocess.run([*git, "write-tree"], cwd=workspace, env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def test_a_tree_is_the_one_git_writes(user, make_instance, tmp_path):
    inst = make_instance(user)
    workspace = inst.workspace_path()
    (workspace / "pkg" / "deep").mkdir(parents=True)
    (workspace / "pkg" / "deep" / "mod.py").write_text("x = 1\n")
    (workspace / "pkg" / "out").mkdir()
    (workspace / "pkg" / "out" / "made.txt").write_text("built\n")
    (workspace / "pkg" / ".gitignore").write_text("out/\n*.tmp\n!keep.tmp\n")
    (workspace / "pkg" / "scratch.tmp").write_text("ignored\n")
    (workspace / "pkg" / "keep.tmp").write_text("kept\n")
    (workspace / ".gitignore").write_text("*.log\n/build\n")
    (workspace / "debug.log").write_text("ignored\n")
    (workspace / "build").mkdir()
    (workspace / "build" / "a.o").write_text("ignored\n")
    (workspace / "run.sh").write_text("echo hi\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "empty").mkdir()
    (workspace / "link").symlink_to("pkg/deep/mod.py")
    (workspace / "dangling").symlink_to("/nowhere/at/all")

    snap = snapshots.take(start(inst))

    assert snap.method == "git"
    assert snap.start_tree == git_write_tree(workspace, tmp_path)


def test_a_workspace_swapped_for_a_symlink_is_refused_not_followed(user, make_instance, settings, tmp_path):
    settings.TETHER_WORKSPACE_ROOTS = [tmp_path / "srv"]
    workspace = tmp_path / "srv" / "team" / "ws"
    workspace.mkdir(parents=True)
    (workspace / "app.py").write_text("x = 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    private_file(outside / "secret.txt", f"{SECRET}\n")
    run = start(make_instance(user, workspace=str(workspace)))
    snapshots.take(run)

    workspace.rename(workspace.with_name("ws-moved"))  # an agent of the parent directory's instance
    workspace.symlink_to(outside)
    live = snapshots.diff(run)
    snapshots.finish(run)
    text = snapshots.diff(run)

    for shown in (live, text):
        assert SECRET not in shown and "secret.txt" not in shown
        assert "symlink" in shown
    assert SECRET not in all_objects(run)
