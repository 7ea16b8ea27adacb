"""Snapshot a run's workspace at its start and end, so a reviewer sees what the run changed.

Runs git (libgit2 in this process for trees, git itself for diffs): call it outside any
transaction. Each run gets a shadow git directory, `TETHER_HOME/snapshots/run-<id>.git`, whose
work tree is the instance's workspace: `git add -A` + `git write-tree` stores the workspace's
files as a tree without touching the workspace (nor its own `.git`, if it is a repository: the
shadow directory is separate). The diff between the start tree and the end tree is the run's
change, new and deleted files included; the workspace's `.gitignore` files are honoured, and the
directories the fingerprint skips (`.git`, `node_modules`, `.venv`, caches) are left out. A
workspace larger than `TETHER_SNAPSHOT_MAX_BYTES` (100 MB) or `TETHER_SNAPSHOT_MAX_FILES` (20,000
files), or a machine without git, gets a fingerprint only and a note saying why there is no diff.

The diff is redacted (`instances.redaction`): a key the agent wrote into a file is not shown.

`take(run)` at the start (idempotent: the first snapshot of a run is kept; a workspace that does
not exist yet is created empty, so everything the run writes shows in the diff), `finish(run)` when the
run finishes or waits (the end tree, replaced each time), `diff(run)` for the review page and the
judge (against the end tree, or the live workspace while the run is not finished).

`mark_iteration(run, number)` as an iteration's first attempt begins (the tree, under the ref
`refs/tether/iteration-N`), and `changed_since_iteration(run, number)` when an attempt of it was
lost: the paths the workspace added, modified or deleted since that iteration began.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pygit2
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from pygit2.enums import ConfigLevel

from instances.redaction import redact
from loops import checks as checks_mod
from reviews.models import WorkspaceSnapshot

log = logging.getLogger(__name__)

GIT_TIMEOUT_SECONDS = 120
DIFF_MAX_CHARS = 400_000


def _root() -> Path:
    return Path(getattr(settings, "TETHER_SNAPSHOTS", settings.TETHER_HOME / "snapshots"))


def git_dir(run_id: int) -> Path:
    return _root() / f"run-{run_id}.git"


def _limits() -> tuple[int, int]:
    return (
        int(getattr(settings, "TETHER_SNAPSHOT_MAX_BYTES", 100 * 1024 * 1024)),
        int(getattr(settings, "TETHER_SNAPSHOT_MAX_FILES", 20_000)),
    )


class SnapshotError(Exception):
    pass


def _git(gitdir: Path, workspace: Path, *args: str, check: bool = True) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(gitdir),
        "LC_ALL": "C",
        "GIT_DIR": str(gitdir),
        "GIT_WORK_TREE": str(workspace),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
    }
    command = [
        "git",
        "-c", "core.autocrlf=false",
        "-c", "core.safecrlf=false",
        "-c", "core.quotepath=off",
        "-c", "gc.auto=0",
        "-c", "core.fsmonitor=false",
        "-c", "advice.addEmbeddedRepo=false",
        *args,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=workspace, env=env, capture_output=True, timeout=GIT_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git failed: {exc}") from None
    if check and done.returncode != 0:
        raise SnapshotError(f"git {args[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode(errors="replace")


def _too_big(workspace: Path) -> str:
    max_bytes, max_files = _limits()
    total = files = 0
    for root, dirs, names in os.walk(workspace):
        dirs[:] = [d for d in dirs if d not in checks_mod.SKIP_DIRS]
        for name in names:
            files += 1
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if files > max_files:
                return f"the workspace has more than {max_files:,} files; no diff is kept"
            if total > max_bytes:
                return f"the workspace is larger than {max_bytes // (1024 * 1024)} MB; no diff is kept"
    return ""


def _tree(run_id: int, workspace: Path) -> str:
    """Store the workspace as a tree in the run's shadow git directory; return the tree id.

    In this process, through libgit2 (`pygit2`): what `git add --all` + `git write-tree` do, the
    same tree id for the same files, without starting two programs on every iteration. The index
    keeps each file's stat, so only what changed since the last tree is read. libgit2 refuses a
    workspace holding another repository (a clone inside it); git itself stores that one.
    """
    gitdir = git_dir(run_id)
    try:
        if not (gitdir / "HEAD").exists():
            gitdir.mkdir(parents=True, exist_ok=True)
            pygit2.init_repository(str(gitdir), bare=True)
            exclude = gitdir / "info" / "exclude"
            exclude.parent.mkdir(parents=True, exist_ok=True)
            exclude.write_text("".join(f"{name}/\n" for name in sorted(checks_mod.SKIP_DIRS)))
        repo = _repository(gitdir, workspace)
        index = repo.index
        index.read()
        index.add_all()
        index.write()
        return str(index.write_tree())
    except pygit2.GitError:
        _git(gitdir, workspace, "add", "--all")
        return _git(gitdir, workspace, "write-tree").strip()
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"git failed: {exc}") from None


def _repository(gitdir: Path, workspace: Path) -> pygit2.Repository:
    """Open the shadow directory with `workspace` as its work tree, blind to the server's git configuration."""
    global _isolated
    with _isolating:  # libgit2's global options are set once, before any thread opens a repository
        if not _isolated:  # as `_git`'s environment does for git: no system, global or XDG configuration
            for level in (ConfigLevel.SYSTEM, ConfigLevel.XDG, ConfigLevel.GLOBAL, ConfigLevel.PROGRAMDATA):
                pygit2.settings.search_path[level] = ""
            _isolated = True
    repo = pygit2.Repository(str(gitdir))
    repo.workdir = str(workspace)
    return repo


_isolated = False
_isolating = threading.Lock()


def _workspace_head(workspace: Path) -> str:
    if not (workspace / ".git").exists():
        return ""
    try:
        done = subprocess.run(
            ["git", "-C", str(workspace), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True,
            timeout=30,
            check=False,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.decode().strip()[:64] if done.returncode == 0 else ""


def _capture(run_id: int, workspace: Path) -> tuple[str, str]:
    """Return (tree id, note); the tree id is "" with a note saying why when there is none."""
    if not workspace.is_dir():
        return "", "the workspace did not exist"
    if shutil.which("git") is None:
        return "", "git is not installed on the server; no diff is kept"
    if reason := _too_big(workspace):
        return "", reason
    try:
        return _tree(run_id, workspace), ""
    except SnapshotError as exc:
        log.warning("run %s: workspace snapshot failed: %s", run_id, exc)
        return "", f"the snapshot failed: {exc}"


def take(run: Any) -> WorkspaceSnapshot:
    """Snapshot the workspace at the run's start; a run keeps its first snapshot (idempotent)."""
    existing = WorkspaceSnapshot.objects.filter(run_id=run.pk).first()
    if existing is not None:
        return existing
    workspace = Path(run.instance.workspace_path())
    try:
        workspace.mkdir(parents=True, exist_ok=True)  # the agent's first act would make it; start from empty
    except OSError:
        pass
    tree, note = _capture(run.pk, workspace)
    try:
        with transaction.atomic():
            return WorkspaceSnapshot.objects.create(
                run_id=run.pk,
                method=WorkspaceSnapshot.Method.GIT if tree else WorkspaceSnapshot.Method.NONE,
                workspace=str(workspace),
                start_tree=tree,
                start_fingerprint=checks_mod.fingerprint(workspace),
                workspace_head=_workspace_head(workspace),
                note=note,
            )
    except IntegrityError:
        return WorkspaceSnapshot.objects.get(run_id=run.pk)


def finish(run: Any) -> WorkspaceSnapshot | None:
    """Record the workspace as the run leaves it (its end tree and fingerprint); None without a start."""
    snapshot = WorkspaceSnapshot.objects.filter(run_id=run.pk).first()
    if snapshot is None:
        return None
    workspace = Path(snapshot.workspace)
    fields: dict[str, Any] = {"end_fingerprint": checks_mod.fingerprint(workspace), "ended_at": timezone.now()}
    if snapshot.method == WorkspaceSnapshot.Method.GIT:
        tree, note = _capture(run.pk, workspace)
        fields["end_tree"] = tree
        if note:
            fields["note"] = f"the end of the run could not be snapshot: {note}"
    WorkspaceSnapshot.objects.filter(pk=snapshot.pk).update(**fields)
    snapshot.refresh_from_db()
    return snapshot


def start_fingerprint(run: Any) -> str:
    """Return the workspace fingerprint taken at the run's start ("" when none was taken)."""
    found = WorkspaceSnapshot.objects.filter(run_id=run.pk).values_list("start_fingerprint", flat=True).first()
    return found or ""


def diff(run: Any, *, max_chars: int = DIFF_MAX_CHARS, paths: Sequence[str] | None = None) -> str:
    """Return the run's workspace changes as a git diff (a stat summary, then the patch).

    Between the start and end trees once the run finished (or waits); against the live
    workspace before. `paths` (workspace-relative, taken literally) limits it to those files.
    When there is no diff, a sentence saying why.
    """
    if paths is not None and not paths:
        return ""
    snapshot = WorkspaceSnapshot.objects.filter(run_id=run.pk).first()
    if snapshot is None:
        return "(no snapshot of the workspace was taken at the start of this run)"
    if snapshot.method != WorkspaceSnapshot.Method.GIT or not snapshot.start_tree:
        same = snapshot.end_fingerprint and snapshot.end_fingerprint == snapshot.start_fingerprint
        changed = "the workspace did not change" if same else "files may have changed"
        return f"(no diff: {snapshot.note or 'no snapshot'}; {changed})"
    gitdir, workspace = git_dir(run.pk), Path(snapshot.workspace)
    try:
        end = snapshot.end_tree or _tree(run.pk, workspace)
        args = ["--no-color", "--no-ext-diff", "--find-renames", snapshot.start_tree, end]
        if paths is not None:
            args += ["--", *(f":(literal){path}" for path in paths)]
        stat = _git(gitdir, workspace, "diff", "--stat=100", "--summary", *args)
        patch = _git(gitdir, workspace, "diff", *args)
    except SnapshotError as exc:
        return f"(no diff: {exc})"
    if not patch.strip():
        return ""
    text = redact(f"{stat.rstrip()}\n\n{patch}")
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n…[diff cut at {max_chars:,} characters; {len(text):,} in all]\n"
    return text


CHANGED_MAX = 200  # paths a lost attempt's record names; the rest are counted


def _iteration_ref(number: int) -> str:
    return f"refs/tether/iteration-{number}"


def mark_iteration(run: Any, number: int) -> None:
    """Store the workspace as iteration `number` begins, for what a lost attempt of it changed.

    Only where the run's start was snapshot with git (a workspace too big, or no git: a lost
    attempt's changes are then unknown, and say why).
    """
    gitdir = git_dir(run.pk)
    if not (gitdir / "HEAD").exists():
        return
    workspace = Path(run.instance.workspace_path())
    tree, _ = _capture(run.pk, workspace)
    if not tree:
        return
    # A loose ref is a file holding the object's id (git's repository layout): written here, it
    # saves a third git process per iteration (`update-ref`).
    ref = gitdir / _iteration_ref(number)
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        partial = gitdir / f"{ref.name}.tmp"
        partial.write_text(f"{tree}\n")
        os.replace(partial, ref)
    except OSError as exc:
        log.warning("run %s: the workspace at iteration %s could not be kept: %s", run.pk, number, exc)


_CHANGES = {"A": "added", "M": "modified", "D": "deleted", "T": "modified"}


def changed_since_iteration(run: Any, number: int) -> dict[str, Any]:
    """Return the workspace's changes since iteration `number` began.

    `{"changed": [{"path", "change"}, ...], "more": n}` (added, modified or deleted; paths
    redacted, at most CHANGED_MAX named), or `{"unknown": why}`.
    """
    gitdir = git_dir(run.pk)
    if not (gitdir / "HEAD").exists():
        note = WorkspaceSnapshot.objects.filter(run_id=run.pk).values_list("note", flat=True).first()
        return {"unknown": note or "no snapshot of the workspace was taken"}
    workspace = Path(run.instance.workspace_path())
    try:
        base = _git(gitdir, workspace, "rev-parse", "--verify", "-q", _iteration_ref(number), check=False).strip()
        if not base:
            return {"unknown": f"the workspace was not kept when iteration {number} began"}
        tree, note = _capture(run.pk, workspace)
        if not tree:
            return {"unknown": redact(note)}
        listed = _git(gitdir, workspace, "diff", "--name-status", "--no-renames", "-z", base, tree)
    except SnapshotError as exc:
        return {"unknown": redact(str(exc))}
    fields = listed.split("\0")
    changed = [
        {"path": redact(path), "change": _CHANGES.get(status[:1], "modified")}
        for status, path in zip(fields[0::2], fields[1::2], strict=False)
        if path
    ]
    return {"changed": changed[:CHANGED_MAX], "more": max(len(changed) - CHANGED_MAX, 0)}
