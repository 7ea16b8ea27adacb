"""Snapshot a run's workspace at its start and end, so a reviewer sees what the run changed.

Each run gets a shadow git directory, `TETHER_HOME/snapshots/run-<id>.git`, holding the
workspace's files as git trees; the diff between the start tree and the end tree is the run's
change, new and deleted files included. The directories the fingerprint skips (`.git`,
`node_modules`, `.venv`, caches) are left out. A workspace larger than `TETHER_SNAPSHOT_MAX_BYTES`
(100 MB) or `TETHER_SNAPSHOT_MAX_FILES` (20,000 files), or a machine without git, gets a
fingerprint only and a note saying why there is no diff.

What the workspace's `.gitignore` files hide is kept too, since an agent writes `.gitignore`:
one that hid itself and a `_pytest.py` once emptied the review diff. It has limits of its own,
`TETHER_SNAPSHOT_HIDDEN_MAX_FILES` (2,000) and `TETHER_SNAPSHOT_HIDDEN_MAX_BYTES` (20 MB), not
counted in the ones above: over them, the largest groups (an ignored directory with all it holds,
or one ignored file) are left out of the tree until the rest fit, and a record beside the tree
names them (`tether-left-out/<tree>`), so build output costs no run its diff and no amount of it
puts a small hidden file out of sight. `diff_sections(run)` splits the diff in two: the files
`.gitignore` (at the start or the end) does not hide, and those it hides, with a sentence naming
what was left out; `diff(run)` gives both, the second under the heading "Files .gitignore hides".

Trees are built in this process (libgit2, `pygit2`) from the workspace held open
(`instances.pinned`), never from its path: an agent's programs can swap a directory, or the
workspace itself, for a symlink while a snapshot is taken, and the server may run as root. So
every entry is reached one component at a time without following links: a file is stored as
its content, a link as its target (as git stores it), a FIFO, socket or device is left out, and
git itself only ever compares trees in the shadow directory. The tree of the same files is the
one `git add --all --force` + `git write-tree` would store; a repository inside the workspace is stored
as its files (its `.git` left out), not as a gitlink, so its changes show in the review. Names
libgit2 cannot store (not UTF-8, or reserved such as `.git`) are left out.

An unchanged file is not read again: each run keeps (in this process) the blob of every file by
its path, size, times and inode, as git's index does.

The diff is redacted (`tether.redaction`): a key the agent wrote into a file is not shown.

`take(run)` at the start (idempotent: the first snapshot of a run is kept; a workspace that does
not exist yet is created empty, so everything the run writes shows in the diff), `finish(run)` when the
run finishes or waits (the end tree, replaced each time), `diff(run)` for the review page and the
judge (against the end tree, or the workspace as it is now while the run is not finished).

`capture(run)` stores the workspace as it is now (a rollback keeps it first: `reviews.rollback`
restores these trees), `repository(run_id)` opens a run's shadow directory.

`mark_iteration(run, number)` as an iteration's first attempt begins (the tree, under the ref
`refs/tether/iteration-N`), and `changed_since_iteration(run, number)` when an attempt of it was
lost: the paths the workspace added, modified or deleted since that iteration began.

Listing a workspace and storing it as a tree live in `reviews.snapshot_trees`; this module takes,
diffs and reads the trees.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec
import pygit2
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from pygit2.enums import FileMode

from instances import sandbox
from instances.pinned import Pinned
from loops import checks as checks_mod
from reviews.models import WorkspaceSnapshot
from reviews.snapshot_trees import (
    SnapshotError,
    TooBig,
    ignore_spec,
    ignored,
    left_out_record,
    open_repository,
    write_tree,
)
from tether.redaction import redact

log = logging.getLogger(__name__)

GIT_TIMEOUT_SECONDS = 120
DIFF_MAX_CHARS = 400_000
HIDDEN_HEADING = "Files .gitignore hides"


def _root() -> Path:
    return Path(settings.TETHER_SNAPSHOTS)


def git_dir(run_id: int) -> Path:
    return _root() / f"run-{run_id}.git"


def _git(gitdir: Path, *args: str, check: bool = True) -> str:
    """Run git on the shadow directory alone (no work tree: it only reads trees already stored)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(gitdir),
        "LC_ALL": "C",
        "GIT_DIR": str(gitdir),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
    }
    command = [
        "git",
        "-c", "core.quotepath=off",
        "-c", "gc.auto=0",
        *args,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=gitdir, env=env, capture_output=True, timeout=GIT_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"git failed: {exc}") from None
    if check and done.returncode != 0:
        raise SnapshotError(f"git {args[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode(errors="replace")


def _pin(workspace: Path) -> Pinned:
    """Hold the workspace open (its checked real path, walked without following a link)."""
    return Pinned(sandbox.checked_workspace(workspace))


_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _workspace_head(workspace: Path) -> str:
    """The commit the workspace's own repository has checked out ("" when none or unknown).

    Read from its `.git` through the workspace held open: bounded reads, no link followed.
    """
    try:
        with _pin(workspace) as ws:
            head = ws.read(".git/HEAD", 4096)[0].decode().strip()
            if not head.startswith("ref: "):
                return head if _OBJECT_ID.fullmatch(head) else ""
            ref = head.removeprefix("ref: ").strip()
            if not ref.startswith("refs/"):
                return ""
            if ws.kind(f".git/{ref}") == "file":
                found = ws.read(f".git/{ref}", 4096)[0].decode().strip()
            else:
                packed = ws.read(".git/packed-refs", 4 * 1024 * 1024)[0].decode(errors="replace")
                lines = packed.splitlines()
                found = next((line.split(" ")[0] for line in lines if line.endswith(f" {ref}")), "")
    except (sandbox.WorkspaceRefused, OSError, UnicodeError):
        return ""
    return found if _OBJECT_ID.fullmatch(found) else ""


def _capture(run_id: int, workspace: Path) -> tuple[str, str]:
    """Return (tree id, note); the tree id is "" with a note saying why when there is none."""
    try:
        ws = _pin(workspace)
    except sandbox.WorkspaceRefused as exc:
        return "", str(exc)
    except FileNotFoundError:
        return "", "the workspace did not exist"
    except OSError as exc:
        return "", f"the workspace could not be opened: {exc}"
    with ws:
        if shutil.which("git") is None:
            return "", "git is not installed on the server; no diff is kept"
        try:
            return write_tree(git_dir(run_id), run_id, ws), ""
        except TooBig as exc:
            return "", str(exc)
        except SnapshotError as exc:
            log.warning("run %s: workspace snapshot failed: %s", run_id, exc)
            return "", f"the snapshot failed: {exc}"


def capture(run: Any) -> tuple[str, str]:
    """Store the run's workspace as it is now as a tree of its shadow directory: (tree id, "") or ("", why not)."""
    return _capture(run.pk, Path(run.instance.workspace_path()))


def repository(run_id: int) -> pygit2.Repository | None:
    """The run's shadow directory opened (None when nothing of its workspace was ever stored)."""
    gitdir = git_dir(run_id)
    return open_repository(gitdir) if (gitdir / "HEAD").exists() else None


def files_changed(snapshot: WorkspaceSnapshot) -> int | None:
    """How many files the run changed (its start tree against its end tree); None when it is not known."""
    if not (snapshot.start_tree and snapshot.end_tree):
        return None
    try:
        repo = repository(snapshot.run_id)
        return None if repo is None else len(repo.diff(snapshot.start_tree, snapshot.end_tree))
    except (pygit2.GitError, ValueError, KeyError):
        return None


def left_out_paths(run_id: int, tree: str) -> list[str]:
    """What `.gitignore` hides that the run's tree `tree` left out (over its limits): paths, a directory's with '/'."""
    return [str(p) for p in left_out_record(git_dir(run_id), tree).get("paths") or []]


def take(run: Any) -> WorkspaceSnapshot:
    """Snapshot the workspace at the run's start; a run keeps its first snapshot (idempotent)."""
    existing = WorkspaceSnapshot.objects.filter(run_id=run.pk).first()
    if existing is not None:
        return existing
    workspace = Path(run.instance.workspace_path())
    try:  # the agent's first act would make it; start from empty
        sandbox.checked_workspace(workspace).mkdir(parents=True, exist_ok=True)
    except (sandbox.WorkspaceRefused, OSError):
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


class _Rules:
    """Which paths the `.gitignore` files of one stored tree hide: decided as the listing decides it
    (`snapshot_trees.list_tree`), from the `.gitignore` files the tree holds."""

    def __init__(self, repo: pygit2.Repository, tree: str) -> None:
        self.root = repo[tree].peel(pygit2.Tree)
        self.rules: dict[str, list[tuple[str, pathspec.GitIgnoreSpec]]] = {}
        self.dirs: dict[str, bool] = {"": False}

    def _rules(self, rel: str) -> list[tuple[str, pathspec.GitIgnoreSpec]]:
        """The rules that apply to the entries of the directory `rel`."""
        if (found := self.rules.get(rel)) is not None:
            return found
        above = self._rules(rel.rpartition("/")[0]) if rel else []
        try:
            ignore = self.root[f"{rel}/.gitignore" if rel else ".gitignore"]
        except KeyError:
            ignore = None
        if isinstance(ignore, pygit2.Blob) and ignore.filemode in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
            above = [*above, (rel, ignore_spec(ignore.data))]
        self.rules[rel] = above
        return above

    def _dir_hidden(self, rel: str) -> bool:
        if (found := self.dirs.get(rel)) is not None:
            return found
        parent = rel.rpartition("/")[0]
        hidden = self._dir_hidden(parent) or ignored(self._rules(parent), rel, True)
        self.dirs[rel] = hidden
        return hidden

    def hides(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        return self._dir_hidden(parent) or ignored(self._rules(parent), path, False)


def _without(repo: pygit2.Repository, tree: str | pygit2.Oid, paths: set[str]) -> str:
    """The tree `tree` with `paths` (files, workspace-relative) taken out, and directories they leave empty."""
    here: set[str] = set()
    below: dict[str, set[str]] = {}
    for path in paths:
        head, _, rest = path.partition("/")
        if rest:
            below.setdefault(head, set()).add(rest)
        else:
            here.add(head)
    builder = repo.TreeBuilder(repo[tree].peel(pygit2.Tree))
    for name in here:
        if builder.get(name) is not None:
            builder.remove(name)
    for name, inside in below.items():
        found = builder.get(name)
        if name in here or found is None or found.type_str != "tree":
            continue
        inner = _without(repo, found.id, inside)
        if len(repo[inner].peel(pygit2.Tree)):
            builder.insert(name, pygit2.Oid(hex=inner), FileMode.TREE)
        else:
            builder.remove(name)
    return str(builder.write())


def _under(path: str, tops: set[str]) -> bool:
    """Whether `path` is one of `tops`, or below one (a directory's may end in a slash)."""
    tops = {top.rstrip("/") for top in tops}
    parts = path.split("/")
    return any("/".join(parts[:n]) in tops for n in range(1, len(parts) + 1))


def _patch(gitdir: Path, start: str, end: str, pathspecs: list[str]) -> str:
    """The diff between two stored trees: a stat summary, then the patch ("" when they hold the same)."""
    args = ["--no-color", "--no-ext-diff", "--find-renames", start, end, *pathspecs]
    stat_lines = _git(gitdir, "diff", "--stat=100", "--summary", *args)
    patch = _git(gitdir, "diff", *args)
    return f"{stat_lines.rstrip()}\n\n{patch}" if patch.strip() else ""


def _named(paths: list[str], more: int, shown: int = 20) -> str:
    extra = len(paths) - shown + more
    named = ", ".join(paths[:shown])
    return f"{named} and {extra:,} more" if extra > 0 else named


def _size(count: int) -> str:
    return f"{count // (1024 * 1024):,} MB" if count >= 1024 * 1024 else f"{count // 1024:,} KB"


def _left_out_notes(records: tuple[dict[str, Any], dict[str, Any]], paths: Sequence[str] | None) -> list[str]:
    """Sentences naming what `.gitignore` hides that a tree left out (over the limits for it)."""
    said: dict[tuple[tuple[str, ...], int, str], list[str]] = {}
    for when, record in zip(("start", "end"), records, strict=True):
        groups = [str(p) for p in record.get("paths") or []]
        more = int(record.get("more") or 0)
        if paths is not None:
            groups, more = [g for g in groups if any(_under(p, {g}) for p in paths)], 0
        if groups or more:
            limits = f"{int(record.get('max_files', 0)):,} files, {_size(int(record.get('max_bytes', 0)))}"
            said.setdefault((tuple(groups), more, limits), []).append(when)
    return [
        f"(not compared: what .gitignore hides was over its limits ({limits}) at the {' and the '.join(whens)} "
        f"of the run; these were left out, and changes in them are not shown: {_named(list(groups), more)})"
        for (groups, more, limits), whens in said.items()
    ]


def _cut(text: str, max_chars: int) -> str:
    if len(text) > max_chars:
        return text[:max_chars] + f"\n…[diff cut at {max_chars:,} characters; {len(text):,} in all]\n"
    return text


def _stored_start(run: Any) -> tuple[WorkspaceSnapshot | None, str]:
    """Return the run's snapshot, and "" when its start is a stored tree, else why there is no diff."""
    snapshot = WorkspaceSnapshot.objects.filter(run_id=run.pk).first()
    if snapshot is None:
        return None, "no snapshot of the workspace was taken at the start of this run"
    if snapshot.method != WorkspaceSnapshot.Method.GIT or not snapshot.start_tree:
        return snapshot, f"no diff: {snapshot.note or 'no snapshot'}"
    return snapshot, ""


def diff_sections(
    run: Any, *, max_chars: int = DIFF_MAX_CHARS, paths: Sequence[str] | None = None
) -> tuple[str, str]:
    """Return the run's workspace changes in two parts: those to files `.gitignore` does not hide,
    and those to files it hides (each a git diff: a stat summary, then the patch).

    A file is hidden when the `.gitignore` files at the start or at the end of the run hide it
    (a `.gitignore` that hides itself included). Together they hold at most `max_chars`
    characters (and a note where cut): the hidden part has at least a quarter of them when both
    are long. When there is no diff, a sentence saying why, and "".
    """
    if paths is not None and not paths:
        return "", ""
    snapshot, why = _stored_start(run)
    if snapshot is None:
        return f"({why})", ""
    if why:
        same = snapshot.end_fingerprint and snapshot.end_fingerprint == snapshot.start_fingerprint
        said = "the workspace did not change" if same else "files may have changed"
        return f"({why}; {said})", ""
    gitdir, start, end = git_dir(run.pk), snapshot.start_tree, snapshot.end_tree
    if not end:
        end, note = _capture(run.pk, Path(snapshot.workspace))
        if not end:
            return f"(no diff: {note})", ""
    pathspecs = [] if paths is None else ["--", *(f":(literal){path}" for path in paths)]
    records = (left_out_record(gitdir, start), left_out_record(gitdir, end))
    try:
        listed = _git(gitdir, "diff", "--name-only", "--no-renames", "-z", start, end, *pathspecs)
        changed = {path for path in listed.split("\0") if path}
        repo = open_repository(gitdir)
        start_rules, end_rules = _Rules(repo, start), _Rules(repo, end)
        hidden = {path for path in changed if start_rules.hides(path) or end_rules.hides(path)}
        left = {str(p) for record in records for p in record.get("paths") or []}
        not_compared = {path for path in changed if _under(path, left)}
        shown_hidden = hidden - not_compared
        if hidden or not_compared:
            leave = hidden | not_compared
            visible = _patch(gitdir, _without(repo, start, leave), _without(repo, end, leave), pathspecs)
        else:
            visible = _patch(gitdir, start, end, pathspecs)
        hidden_patch = ""
        if shown_hidden:
            leave = changed - shown_hidden
            hidden_patch = _patch(gitdir, _without(repo, start, leave), _without(repo, end, leave), pathspecs)
    except (SnapshotError, pygit2.GitError, KeyError, ValueError, OSError) as exc:
        return f"(no diff: {exc})", ""
    notes = _left_out_notes(records, paths)
    hidden_text = "\n".join([*notes, hidden_patch]).strip("\n")
    if hidden_text:
        hidden_text += "\n"
    visible_text, hidden_text = redact(visible), redact(hidden_text)
    hidden_room = max_chars - min(len(visible_text), max_chars * 3 // 4)
    hidden_text = _cut(hidden_text, hidden_room)
    visible_text = _cut(visible_text, max(max_chars - len(hidden_text), 0))
    return visible_text, hidden_text


def diff(run: Any, *, max_chars: int = DIFF_MAX_CHARS, paths: Sequence[str] | None = None) -> str:
    """Return the run's workspace changes as a git diff (a stat summary, then the patch).

    Between the start and end trees once the run finished (or waits); before, between the start
    tree and a tree of the workspace as it is now. `paths` (workspace-relative, taken literally)
    limits it to those files. The changes to files `.gitignore` hides follow under their own
    heading (`diff_sections`). When there is no diff, a sentence saying why.
    """
    visible, hidden = diff_sections(run, max_chars=max_chars, paths=paths)
    if not hidden:
        return visible
    heading = f"=== {HIDDEN_HEADING} ===\n{hidden}"
    return f"{visible.rstrip()}\n\n{heading}" if visible else heading


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
    tree, _ = capture(run)
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
    try:
        base = _git(gitdir, "rev-parse", "--verify", "-q", _iteration_ref(number), check=False).strip()
        if not base:
            return {"unknown": f"the workspace was not kept when iteration {number} began"}
        tree, note = capture(run)
        if not tree:
            return {"unknown": redact(note)}
        listed = _git(gitdir, "diff", "--name-status", "--no-renames", "-z", base, tree)
    except SnapshotError as exc:
        return {"unknown": redact(str(exc))}
    fields = listed.split("\0")
    changed = [
        {"path": redact(path), "change": _CHANGES.get(status[:1], "modified")}
        for status, path in zip(fields[0::2], fields[1::2], strict=False)
        if path
    ]
    return {"changed": changed[:CHANGED_MAX], "more": max(len(changed) - CHANGED_MAX, 0)}


TAMPER_SCAN_FILES = 200  # changed files read for the tamper scan
TAMPER_SCAN_BYTES = 1_000_000  # of each
NO_OBJECT = pygit2.Oid(hex="0" * 40)  # a side of a delta where the file is absent


def _contents(repo: pygit2.Repository, side: pygit2.DiffFile) -> bytes | None:
    """Return one side of a delta's contents, up to TAMPER_SCAN_BYTES (None: the file is absent on that side)."""
    obj = repo.get(side.id) if side.id != NO_OBJECT else None
    return obj.data[:TAMPER_SCAN_BYTES] if isinstance(obj, pygit2.Blob) else None


def changed_sources(run: Any, suffixes: tuple[str, ...] = (".py", ".pyw")) -> tuple[dict[str, bytes | None], ...]:
    """Return `(before, after)`: the contents of the files with `suffixes` the run changed since its start.

    From the run's start tree and the workspace as it is now (None: absent on that side); at
    most TAMPER_SCAN_FILES files of TAMPER_SCAN_BYTES each (a bigger one is passed cut). Empty
    when the start was not snapshot with git.
    """
    gitdir = git_dir(run.pk)
    start = WorkspaceSnapshot.objects.filter(run_id=run.pk).values_list("start_tree", flat=True).first()
    if not start or not (gitdir / "HEAD").exists():
        return {}, {}
    tree, _ = capture(run)
    if not tree:
        return {}, {}
    repo = open_repository(gitdir)
    old_tree, new_tree = repo.get(start), repo.get(tree)
    if not isinstance(old_tree, pygit2.Tree) or not isinstance(new_tree, pygit2.Tree):
        return {}, {}
    before: dict[str, bytes | None] = {}
    after: dict[str, bytes | None] = {}
    for patch in old_tree.diff_to_tree(new_tree).deltas:
        path = patch.new_file.path or patch.old_file.path
        if not path.endswith(suffixes):
            continue
        if len(after) >= TAMPER_SCAN_FILES:
            break
        before[path], after[path] = _contents(repo, patch.old_file), _contents(repo, patch.new_file)
    return before, after


DELTAS_MAX = 2000  # changed files a run's file deltas measure (line counts); the rest are counted
_DELTA_STATUS = {"A": "added", "D": "removed", "M": "changed", "T": "changed", "R": "changed", "C": "added"}


@dataclass(frozen=True)
class FileDelta:
    """One file the run changed between its start and end trees, with its line counts."""

    path: str
    status: str  # "added", "changed" or "removed"
    lines_added: int
    lines_removed: int
    binary: bool
    before: bytes | None = None  # the contents, only for the paths asked for (`read`)
    after: bytes | None = None


def file_deltas(run: Any, read: Any = None) -> tuple[list[FileDelta], int, str]:
    """Return the files the run changed from its start tree to its end tree: `(deltas, more, note)`.

    From the stored trees only (nothing in the workspace is read): at most DELTAS_MAX measured,
    `more` counts the rest. `read(path)` says whose contents (both sides, up to
    TAMPER_SCAN_BYTES each) come with the delta. Without a start and an end tree, no deltas and
    `note` says why.
    """
    snapshot, why = _stored_start(run)
    if snapshot is None or why:
        return [], 0, why
    if not snapshot.end_tree:
        return [], 0, "the workspace is snapshot again when the run finishes or waits"
    repo = repository(run.pk)
    try:
        if repo is None:
            raise KeyError(snapshot.start_tree)
        diff = repo.diff(repo[snapshot.start_tree].peel(pygit2.Tree), repo[snapshot.end_tree].peel(pygit2.Tree))
        deltas: list[FileDelta] = []
        total = len(diff)
        for index in range(min(total, DELTAS_MAX)):
            patch = diff[index]
            if patch is None:
                continue
            delta = patch.delta
            path = delta.new_file.path or delta.old_file.path
            _, added, removed = patch.line_stats
            sides: tuple[bytes | None, bytes | None] = (None, None)
            if read is not None and read(path):
                sides = _contents(repo, delta.old_file), _contents(repo, delta.new_file)
            status = _DELTA_STATUS.get(delta.status_char(), "changed")
            deltas.append(FileDelta(path, status, added, removed, delta.is_binary, *sides))
    except (pygit2.GitError, KeyError, ValueError, OSError) as exc:
        return [], 0, f"no diff: {exc}"
    return deltas, max(total - DELTAS_MAX, 0), snapshot.note
