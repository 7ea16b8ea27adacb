"""A rollback writes into a workspace an agent controlled: it never follows what the agent left there.

Tether (possibly root) restores a snapshot's files into the workspace. The agent may have
left symlinks to files and directories outside (to `TETHER_HOME`, `/etc`), hardlinks to outside
files, FIFOs where files were, or may swap a directory for a symlink while the restore runs.
None of it may make a rollback write, truncate or remove anything outside the workspace, or hang.
"""

import os
import subprocess
import sys
import threading
import time

import pytest
from django.utils import timezone

from loops import services
from loops.models import Run
from reviews import rollback, snapshots

pytestmark = pytest.mark.django_db

SECRET = "ROOT-ONLY-SECRET-rollback-1c9e"
AT_FDCWD, RENAME_EXCHANGE = -100, 2
SWAPPER = f"""
import ctypes, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
swaps = 0
def done(*_):
    print(swaps, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
print("swapping", flush=True)
while True:
    if libc.renameat2({AT_FDCWD}, a, {AT_FDCWD}, b, {RENAME_EXCHANGE}) == 0:
        swaps += 1
"""


@pytest.fixture(autouse=True)
def snapshot_settings(settings, tmp_path):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"


def ended(instance):
    """A run of `instance` whose start was snapshot, finished (what its agent did is done by the test)."""
    run = services.run_start(instance=instance, user=instance.owner, objective="change the workspace")
    snapshots.take(run)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FINISHED,
        outcome=Run.Outcome.CANCELLED,
        finished_at=timezone.now(),
        lease_expires_at=None,
    )
    run.refresh_from_db()
    return run


def outside_file(path, text=SECRET + "\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_symlink_to_an_outside_file_is_replaced_never_written_through(
    user, make_instance, tmp_path, settings
):
    home_file = outside_file(settings.TETHER_HOME / "h31-rollback-secret.txt")  # a file of Tether's own
    try:
        inst = make_instance(user)
        ws = inst.workspace_path()
        ws.mkdir(parents=True)
        (ws / "config.txt").write_text("setting = 1\n")
        run = ended(inst)
        (ws / "config.txt").unlink()
        (ws / "config.txt").symlink_to(home_file)  # the agent's doing
        (ws / "passwd").symlink_to("/etc/passwd")
        etc_before = open("/etc/passwd", "rb").read()

        result = rollback.rollback(run=run, user=user, to="start")

        assert home_file.read_text() == SECRET + "\n"
        assert open("/etc/passwd", "rb").read() == etc_before
        assert not (ws / "config.txt").is_symlink() and (ws / "config.txt").read_text() == "setting = 1\n"
        assert not os.path.lexists(ws / "passwd") and os.path.exists("/etc/passwd")
        assert result.exact

        undone = rollback.rollback(run=run, user=user, to=result.undo)  # the links come back as links
        assert undone.exact
        assert (
            os.readlink(ws / "config.txt") == str(home_file) and os.readlink(ws / "passwd") == "/etc/passwd"
        )
        assert home_file.read_text() == SECRET + "\n"
    finally:
        home_file.unlink()


def test_a_snapshot_directory_now_a_symlink_to_an_outside_directory_is_not_followed(
    user, make_instance, tmp_path
):
    outside = tmp_path / "outside"
    outside_file(outside / "a.txt")
    outside_file(outside / "b.txt")
    inst = make_instance(user)
    ws = inst.workspace_path()
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "a.txt").write_text("inside a\n")
    run = ended(inst)
    (ws / "sub" / "a.txt").unlink()
    (ws / "sub").rmdir()
    (ws / "sub").symlink_to(outside, target_is_directory=True)  # the agent's doing

    result = rollback.rollback(run=run, user=user, to="start")

    assert sorted(p.name for p in outside.iterdir()) == ["a.txt", "b.txt"]
    assert (outside / "a.txt").read_text() == SECRET + "\n" and (
        outside / "b.txt"
    ).read_text() == SECRET + "\n"
    assert not (ws / "sub").is_symlink() and (ws / "sub" / "a.txt").read_text() == "inside a\n"
    assert result.exact and result.deleted == ["sub"] and result.added == ["sub/a.txt"]


def test_a_hardlink_to_an_outside_file_keeps_that_file_as_it_is(user, make_instance, tmp_path):
    outside = outside_file(tmp_path / "outside" / "linked.txt")
    inst = make_instance(user)
    ws = inst.workspace_path()
    ws.mkdir(parents=True)
    (ws / "data.txt").write_text("data as it was\n")
    run = ended(inst)
    (ws / "data.txt").unlink()
    os.link(outside, ws / "data.txt")  # the same inode as a file outside

    rollback.rollback(run=run, user=user, to="start")

    assert outside.read_text() == SECRET + "\n"
    assert (ws / "data.txt").read_text() == "data as it was\n"
    assert os.stat(ws / "data.txt").st_ino != os.stat(outside).st_ino


@pytest.mark.django_db(transaction=True)
def test_a_fifo_where_a_file_was_neither_hangs_nor_is_dropped_silently(user, make_instance):
    inst = make_instance(user)
    ws = inst.workspace_path()
    ws.mkdir(parents=True)
    (ws / "notes.txt").write_text("notes\n")
    run = ended(inst)
    (ws / "notes.txt").unlink()
    os.mkfifo(ws / "notes.txt")
    results = {}

    def roll():
        from django.db import connection

        try:
            results["plan"] = rollback.plan(run=run, to="start")
            results["done"] = rollback.rollback(run=run, user=user, to="start")
        finally:
            connection.close()

    worker = threading.Thread(target=roll, daemon=True)
    worker.start()
    worker.join(30)
    hung = worker.is_alive()
    if hung:  # let a reader stuck in open() go
        os.close(os.open(ws / "notes.txt", os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
    assert not hung, "a rollback blocked on a FIFO"
    assert "notes.txt" in results["plan"].kept
    assert any(line.startswith("notes.txt: ") for line in results["done"].not_restored)
    assert results["done"].exact is False


def test_a_directory_in_the_way_that_holds_what_snapshots_skip_is_kept_and_named(user, make_instance):
    inst = make_instance(user)
    ws = inst.workspace_path()
    ws.mkdir(parents=True)
    (ws / "lib").write_text("lib was a file\n")
    run = ended(inst)
    (ws / "lib").unlink()
    (ws / "lib" / "node_modules").mkdir(parents=True)
    (ws / "lib" / "node_modules" / "dep.js").write_text("kept\n")
    (ws / "lib" / "code.py").write_text("x = 1\n")

    result = rollback.rollback(run=run, user=user, to="start")

    assert (ws / "lib" / "node_modules" / "dep.js").read_text() == "kept\n"
    assert not (ws / "lib" / "code.py").exists()
    assert "lib/node_modules/" in result.kept
    assert any(line.startswith("lib: ") for line in result.not_restored)


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership is changed only when Tether runs as root")
def test_as_root_restored_files_belong_to_the_workspace_owner_not_root(user, make_instance):
    inst = make_instance(user)
    ws = inst.workspace_path()
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("x = 1\n")
    run = ended(inst)
    (ws / "pkg" / "mod.py").unlink()
    (ws / "pkg").rmdir()
    for path in (ws,):
        os.chown(path, 54321, 54321)

    rollback.rollback(run=run, user=user, to="start")

    assert os.stat(ws / "pkg").st_uid == 54321 and os.stat(ws / "pkg" / "mod.py").st_uid == 54321


def test_a_directory_swapped_for_a_symlink_during_rollbacks_never_lets_one_write_outside(
    user, make_instance, tmp_path
):
    outside = tmp_path / "outside"
    inst = make_instance(user)
    ws = inst.workspace_path()
    (ws / "sub").mkdir(parents=True)
    for n in range(40):  # the same names inside and outside: a path followed mid-write lands outside
        (ws / "sub" / f"f{n}.txt").write_text(f"inside {n}\n")
        outside_file(outside / f"f{n}.txt")
    run = ended(inst)
    for n in range(40):
        (ws / "sub" / f"f{n}.txt").write_text(f"changed {n}\n")
    (ws / "swap").symlink_to(outside, target_is_directory=True)

    # The swapper is its own process, as an agent's would be: a thread of this one was seen starved of
    # the GIL by the rollbacks on a busy machine (1 swap in 3 s), and then the race was never run.
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(ws / "sub"), str(ws / "swap")], stdout=subprocess.PIPE, text=True
    )
    assert swapper.stdout is not None and swapper.stdout.readline().strip() == "swapping"
    until, rounds = time.monotonic() + 3, 0
    try:
        while rounds < 20 and (rounds < 3 or time.monotonic() < until):
            try:
                rollback.rollback(run=run, user=user, to="start")
            except services.Refused:
                pass  # a snapshot that met the swap mid-way; nothing was written
            rounds += 1
    finally:
        swapper.terminate()
        swaps = int(swapper.communicate(timeout=10)[0].strip() or 0)

    assert swaps > 100
    assert sorted(p.name for p in outside.iterdir()) == sorted(f"f{n}.txt" for n in range(40))
    assert all((outside / f"f{n}.txt").read_text() == SECRET + "\n" for n in range(40))
    assert not any(p.name.startswith(".tether-restore-") for p in outside.iterdir())
