"""The server never follows what an agent controls: host-side work on a workspace goes through descriptors.

An agent's programs (or a sibling instance's, whose workspace holds this one) rename, swap and
symlink while the server works on the workspace as root. These tests do that from real
processes — a swapper exchanging a directory and a symlink with renameat2(RENAME_EXCHANGE) as
fast as it can — while the file tools, the fingerprint, the protected digests, the delegation
copy and its patch, the usage file and program spawns (chown + bind mount) run against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from instances import sandbox
from instances.tools import ToolContext, run_tool
from tests.fakes.messages_server import Delay, text, tool_uses
from tests.instances.conftest import act, agent, no_ambient_keys, server  # noqa: F401 - the fixtures
from tests.support.cluster import wait_for

pytestmark = pytest.mark.django_db

SECRET = "ROOT-ONLY-SECRET-7f3a9c"
STRESS_SECONDS = 20

SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, seconds, pause = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3]), float(sys.argv[4])
ends = time.monotonic() + seconds
flips = 0
while time.monotonic() < ends:
    if libc.renameat2(-100, a, -100, b, 2) == 0:  # RENAME_EXCHANGE
        flips += 1
    if pause:
        time.sleep(pause)
print(flips)
"""


def _outside(tmp_path: Path) -> Path:
    """A root-only directory outside every workspace, holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "secret.txt").chmod(0o600)
    return outside


def _swapper(a: Path, b: Path, seconds: float, pause: float = 0.0) -> subprocess.Popen[str]:
    """Exchange `a` and `b` for `seconds`, as fast as it can or every `pause` seconds."""
    return subprocess.Popen([sys.executable, "-c", SWAPPER, str(a), str(b), str(seconds), str(pause)],
                            stdout=subprocess.PIPE, text=True)


def test_a_workspace_swapped_for_a_symlink_mid_act_reaches_nothing_outside(agent, act, server, tmp_path):  # noqa: F811
    outside = _outside(tmp_path)
    inst = agent(tools=["list_files", "read_file", "write_file", "search_files"])
    ws = inst.workspace_path()
    (ws / "mine.txt").write_text("mine\n")
    server.enqueue(
        Delay(1.0, tool_uses([
            ("read_file", {"path": "secret.txt"}),
            ("list_files", {"path": "."}),
            ("search_files", {"pattern": "SECRET"}),
            ("write_file", {"path": "planted.txt", "content": "planted"}),
        ])),
        text("done"),
    )

    def swap_once_asked():  # a sibling's program renames the workspace and leaves a symlink in its place
        wait_for(lambda: server.calls >= 1, 10, "the model to be asked")
        ws.rename(ws.with_name(ws.name + "-moved"))
        ws.symlink_to(outside, target_is_directory=True)

    swapper = threading.Thread(target=swap_once_asked)
    swapper.start()
    reply = act(inst)
    swapper.join()
    assert SECRET not in json.dumps(server.bodies) and SECRET not in json.dumps(reply.tool_calls)
    assert not (outside / "planted.txt").exists()
    assert (ws.with_name(ws.name + "-moved") / "planted.txt").read_text() == "planted"  # the pinned directory


@pytest.mark.django_db(transaction=True)  # the review's thread reads the runs
def test_a_swapper_racing_every_host_side_operation_reaches_nothing_outside(make_instance, user, tmp_path):
    from django.db import connection

    from instances import pinned
    from loops import delegation_results, services
    from reviews import snapshots

    outside = _outside(tmp_path)
    inst = make_instance(user, name="raced")
    ws = inst.workspace_path()
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "secret.txt").write_text("decoy\n")
    (ws / "swap").symlink_to(outside, target_is_directory=True)
    copied = make_instance(user, name="its-copy")
    copied.workspace_path().mkdir(parents=True)
    run = services.run_start(instance=inst, user=user, objective="raced")
    copy_run = services.run_start(instance=copied, user=user, objective="a copy")
    snapshots.take(run)
    ctx = ToolContext(workspace=ws, instance_id=inst.pk, pinned=pinned.Pinned(ws.resolve()))
    found: list[str] = []
    stop = threading.Event()

    def tools() -> None:
        while not stop.is_set():
            for name, args in [
                ("read_file", {"path": "sub/secret.txt"}),
                ("list_files", {"path": "sub"}),
                ("search_files", {"pattern": "SECRET", "path": "."}),
                ("write_file", {"path": "sub/planted.txt", "content": "planted"}),
                ("edit_file", {"path": "sub/secret.txt", "old_text": "decoy", "new_text": "decoy"}),
            ]:
                result = run_tool(name, args, ctx)
                if SECRET in result.content:
                    found.append(f"{name}: {result.content[:80]}")

    def host_side() -> None:
        from instances import protected
        from loops import checks

        copies = 0
        while not stop.is_set():
            checks.fingerprint(ws)
            protected.digests(ws, ["sub/**", "*.txt"])
            target = tmp_path / f"copy-{copies}"
            target.mkdir()
            with pinned.Pinned(ws.resolve()) as source, pinned.Pinned(target) as into:
                pinned.copy_tree(source, into)
            for path in target.rglob("*"):
                if path.is_file() and not path.is_symlink() and SECRET in path.read_text(errors="replace"):
                    found.append(f"copy: {path}")
            copies += 1

    reviews: list[int] = []

    def reviewed() -> None:  # the review's live diff and the delegation patch of a copy
        try:
            while not stop.is_set():
                for name, said in [("diff", snapshots.diff(run)), ("patch", delegation_results.workspace_patch(run, copy_run))]:
                    if SECRET in said:
                        found.append(f"{name}: {said[:80]}")
                reviews.append(1)
        finally:
            connection.close()

    swapper = _swapper(ws / "sub", ws / "swap", STRESS_SECONDS)
    workers = [threading.Thread(target=tools), threading.Thread(target=host_side), threading.Thread(target=reviewed)]
    for worker in workers:
        worker.start()
    spawned = refused = 0
    try:
        while spawned + refused < 50 and swapper.poll() is None:
            try:
                proc, _ = sandbox.spawn(["sh", "-c", "cat sub/secret.txt; touch sub/marker"],
                                        sandbox.Spec(workspace=ws, instance_id=inst.pk),
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            except (sandbox.WorkspaceRefused, OSError):
                refused += 1
                continue
            out = proc.communicate(timeout=30)[0].decode(errors="replace")
            if SECRET in out:
                found.append("a sandboxed program read it")
            spawned += 1
    finally:
        flips = int(swapper.communicate(timeout=STRESS_SECONDS + 30)[0] or 0)
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
        ctx.pinned.close()
    assert flips > 1000, f"the swapper flipped only {flips} times"
    assert spawned >= 40, (spawned, refused)
    assert len(reviews) >= 3, f"the review's diff and the patch ran only {len(reviews)} times"
    assert found == []
    assert not (outside / "planted.txt").exists() and not (outside / "marker").exists()
    info = (outside / "secret.txt").stat()
    assert (info.st_uid, info.st_mode & 0o777) == (os.getuid(), 0o600), "a foreign file was chowned"
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


def test_the_copy_patch_shows_a_link_as_a_link_never_its_target(make_instance, user, tmp_path):
    from loops import delegation_results, services

    outside = _outside(tmp_path)
    lead = make_instance(user, name="lead")
    builder = make_instance(user, name="builder")
    lead.workspace_path().mkdir(parents=True)
    builder.workspace_path().mkdir(parents=True)
    (builder.workspace_path() / "leak.txt").symlink_to(outside / "secret.txt")
    parent = services.run_start(instance=lead, user=user, objective="lead")
    child = services.run_start(instance=builder, user=user, objective="build")
    patch = delegation_results.workspace_patch(parent, child)
    assert SECRET not in patch
    assert "(a symbolic link to" in patch and "leak.txt" in patch


def test_a_mount_is_the_directory_checked_never_what_was_swapped_in(
    make_instance, user, other_user, tmp_path, settings
):
    settings.TETHER_WORKSPACE_ROOTS = [tmp_path.resolve()]  # where workspaces are allowed, as in production
    victim = make_instance(other_user, name="victim")
    victim_ws = victim.workspace_path()
    victim_ws.mkdir(parents=True)
    (victim_ws / "victim.txt").write_text(SECRET + "\n")
    (victim_ws / "victim.txt").chmod(0o600)
    before = (victim_ws / "victim.txt").stat()
    mine = make_instance(user, name="mine")
    ws = mine.workspace_path()
    ws.mkdir(parents=True)
    decoy = ws.with_name(ws.name + "-swap")
    decoy.symlink_to(victim_ws, target_is_directory=True)
    swapper = _swapper(ws, decoy, 180, pause=0.003)  # each state lasts about as long as a spawn's setup
    leaked = mounted = refused = 0
    try:
        # Spawns go on until 15 were mounted (a loaded machine refuses more of them, 11 in 400 was seen,
        # and takes seconds over each), bounded by 4,000 tries and the swapper's 180 s.
        while mounted < 15 and mounted + refused < 4000 and swapper.poll() is None:
            try:
                proc, _ = sandbox.spawn(["sh", "-c", "cat victim.txt 2>/dev/null; touch marker"],
                                        sandbox.Spec(workspace=ws, instance_id=mine.pk),
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            except (sandbox.WorkspaceRefused, OSError):
                refused += 1
                continue
            leaked += SECRET in proc.communicate(timeout=30)[0].decode(errors="replace")
            mounted += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert mounted >= 15, (mounted, refused)
    assert leaked == 0 and not (victim_ws / "marker").exists()
    after = (victim_ws / "victim.txt").stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid), "the victim's file was chowned"


def test_fifos_devices_and_sparse_files_never_hang_or_flood_the_host(tmp_path):
    from instances import protected
    from instances.brains.command import read_usage
    from loops import checks

    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "hang.fifo")
    (ws / "zero").symlink_to("/dev/zero")
    with open(ws / "big", "wb") as fh:
        fh.truncate(10 * 1024**3)  # 10 GB, sparse
    (ws / "ok.txt").write_text("ok\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    results: dict[str, object] = {}

    def everything() -> None:
        results["fingerprint"] = checks.fingerprint(ws)
        results["digests"] = protected.digests(ws, ["*"])
        ctx = ToolContext(workspace=ws)
        results["read_fifo"] = run_tool("read_file", {"path": "hang.fifo"}, ctx).content
        results["read_zero"] = run_tool("read_file", {"path": "zero"}, ctx).content
        results["search"] = run_tool("search_files", {"pattern": "ok"}, ctx).content
        results["write_fifo"] = run_tool("write_file", {"path": "hang.fifo", "content": "x"}, ctx).content
        os.mkfifo(scratch / "usage.json")
        results["usage_fifo"] = read_usage(scratch / "usage.json")
        (scratch / "usage.json").unlink()
        (scratch / "usage.json").symlink_to("/dev/zero")
        results["usage_zero"] = read_usage(scratch / "usage.json")
        (scratch / "usage.json").unlink()
        with open(scratch / "usage.json", "wb") as fh:
            fh.truncate(10 * 1024**3)
        results["usage_sparse"] = read_usage(scratch / "usage.json")

    began = time.monotonic()
    worker = threading.Thread(target=everything, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), f"hung after {sorted(results)}"
    assert time.monotonic() - began < 30
    assert results["fingerprint"]
    assert "not a file" in str(results["read_fifo"]) and "symlink" in str(results["read_zero"])
    assert results["search"] == "ok.txt:1: ok"
    assert "not a regular file" in str(results["write_fifo"])
    from instances.brains.base import Usage

    assert results["usage_fifo"] == results["usage_zero"] == results["usage_sparse"] == Usage()


def test_no_user_namespace_can_be_made_inside_the_sandbox(make_instance, user):
    inst = make_instance(user, name="userns")
    inst.workspace_path().mkdir(parents=True)
    proc, sandboxed = sandbox.spawn(
        ["sh", "-c", "unshare -U -r true && echo MADE || echo REFUSED; id -u; touch mine"],
        sandbox.Spec(workspace=inst.workspace_path(), instance_id=inst.pk),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    said, uid = proc.communicate(timeout=30)[0].decode().split()
    assert sandboxed and said == "REFUSED"
    expected = sandbox._uid(inst.pk)
    if expected is not None:  # as root: the program runs as the instance's uid, and its files are its own
        assert int(uid) == expected == (inst.workspace_path() / "mine").stat().st_uid


def test_the_workspace_check_never_follows_a_link_swapped_in_while_it_looks(make_instance, user, other_user, tmp_path, settings):
    """Each component is looked at once: a swap between "is it a link?" and "where does it lead?" is not followed."""
    settings.TETHER_WORKSPACE_ROOTS = [tmp_path.resolve()]
    victim_ws = make_instance(other_user, name="victim").workspace_path()
    victim_ws.mkdir(parents=True)
    ws = make_instance(user, name="mine").workspace_path()
    ws.mkdir(parents=True)
    decoy = ws.with_name(ws.name + "-swap")
    decoy.symlink_to(victim_ws, target_is_directory=True)
    swapper = _swapper(ws, decoy, 5)  # as fast as it can
    led_to_victim = looked = 0
    try:
        ends = time.monotonic() + 4
        while time.monotonic() < ends and swapper.poll() is None:
            try:
                led_to_victim += sandbox.checked_workspace(ws) == victim_ws.resolve()
            except sandbox.WorkspaceRefused:
                pass
            looked += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert looked > 100 and led_to_victim == 0, (looked, led_to_victim)
