"""Building a run's workspace as a git tree: what a tree keeps (listing) and storing it (blobs and trees).

The listing walks the workspace held open (`instances.pinned`) one component at a time, without
following links, within `TETHER_SNAPSHOT_MAX_BYTES` / `TETHER_SNAPSHOT_MAX_FILES`; what `.gitignore`
hides is kept within limits of its own, its largest groups left out (and named in a record beside
the tree) when over them. Storing writes the listing as blobs and trees into the run's shadow
directory (libgit2), reading a file again only when it changed since the run's last tree. See
`reviews.snapshots`, which takes, diffs and reads these trees.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec
import pygit2
from django.conf import settings
from pygit2.enums import ConfigLevel, FileMode

from instances.pinned import Entry, Pinned, open_file_at
from loops import checks as checks_mod

IGNORE_FILE_MAX_BYTES = 256 * 1024  # of each `.gitignore` read
MAX_DEPTH = 256  # directories nested deeper get no diff
CACHED_RUNS = 16  # runs whose file blobs this process remembers
RECENT_NS = 2_000_000_000  # a file changed this recently is read again next time (a write may keep its times)
HIDDEN_WALK_FACTOR = 4  # hidden files walked at most, in kept ones; past it, groups are left out unwalked
LEFT_OUT_NAMED = 1000  # left-out groups a tree's record names; the rest are counted


def _limits() -> tuple[int, int]:
    return (
        int(settings.TETHER_SNAPSHOT_MAX_BYTES),
        int(settings.TETHER_SNAPSHOT_MAX_FILES),
    )


def _hidden_limits() -> tuple[int, int]:
    return (
        int(settings.TETHER_SNAPSHOT_HIDDEN_MAX_BYTES),
        int(settings.TETHER_SNAPSHOT_HIDDEN_MAX_FILES),
    )


class SnapshotError(Exception):
    pass


class TooBig(Exception):
    """The workspace is over a limit; the message says which."""


# --- listing: what a tree keeps -------------------------------------------------------


Listing = dict[str, Any]  # name → "file", "link", or the listing of a directory


@dataclass
class _Count:
    max_bytes: int
    max_files: int
    files: int = 0
    total: int = 0

    def add(self, size: int) -> None:
        self.files += 1
        self.total += size
        if self.files > self.max_files:
            raise TooBig(f"the workspace has more than {self.max_files:,} files; no diff is kept")
        if self.total > self.max_bytes:
            raise self.too_large()

    def too_large(self) -> TooBig:
        return TooBig(f"the workspace is larger than {self.max_bytes // (1024 * 1024)} MB; no diff is kept")


def ignored(rules: list[tuple[str, pathspec.GitIgnoreSpec]], path: str, is_dir: bool) -> bool:
    """Whether the `.gitignore` files above `path` ignore it: the deepest one that decides wins, as in git."""
    for base, spec in reversed(rules):
        relative = path[len(base) + 1 :] if base else path
        decided = spec.check_file(f"{relative}/" if is_dir else relative).include
        if decided is not None:
            return decided
    return False


def ignore_spec(data: bytes) -> pathspec.GitIgnoreSpec:
    lines = data[:IGNORE_FILE_MAX_BYTES].removeprefix(b"\xef\xbb\xbf").decode(errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


@dataclass
class _Group:
    """A file or directory `.gitignore` hides, where the hiding starts (no hidden directory above it)."""

    path: str
    is_dir: bool
    files: int = 0
    total: int = 0
    whole: bool = True  # walked to its end within the limits


@dataclass
class _Hidden:
    """What `.gitignore` hides in one listing, kept within limits of its own.

    The files `.gitignore` hides are kept (and shown, under their own heading) up to
    `TETHER_SNAPSHOT_HIDDEN_MAX_FILES` files and `TETHER_SNAPSHOT_HIDDEN_MAX_BYTES` bytes: over
    them, the largest groups (an ignored directory and all it holds, or one ignored file) are
    left out and named, so that ordinary build output does not cost the run its diff, and no
    amount of it puts a small hidden file out of the reviewer's sight.
    """

    max_bytes: int
    max_files: int
    groups: list[_Group] = field(default_factory=list)
    walked: int = 0  # groups begun and files counted
    unwalked: list[str] = field(default_factory=list)  # groups past the walking limit (named up to LEFT_OUT_NAMED)
    unwalked_more: int = 0

    def start(self, path: str, *, is_dir: bool) -> _Group | None:
        """Begin the group at `path`; None past the walking limit (it is then left out, unwalked)."""
        self.walked += 1
        if self.walked > HIDDEN_WALK_FACTOR * self.max_files:
            if len(self.unwalked) < LEFT_OUT_NAMED:
                self.unwalked.append(f"{path}/" if is_dir else path)
            else:
                self.unwalked_more += 1
            return None
        group = _Group(path, is_dir)
        self.groups.append(group)
        return group

    def add(self, group: _Group, size: int) -> None:
        group.files += 1
        group.total += size
        self.walked += 1
        if group.files > self.max_files or group.total > self.max_bytes:
            group.whole = False

    def left_out(self) -> list[_Group]:
        """The groups the tree leaves out: those not walked whole, then the largest until the rest fit."""
        dropped = [g for g in self.groups if not g.whole]
        kept = sorted((g for g in self.groups if g.whole), key=lambda g: (g.files, g.total, g.path))
        files, total = sum(g.files for g in kept), sum(g.total for g in kept)
        while kept and (files > self.max_files or total > self.max_bytes):
            group = kept.pop()
            files, total = files - group.files, total - group.total
            dropped.append(group)
        return sorted(dropped, key=lambda g: g.path)


def _never_kept(entry: Entry) -> bool:
    """Whether no tree keeps `entry`: a `.git`, a FIFO, socket or device, or a directory the fingerprint skips."""
    return (
        entry.name.lower() == ".git"
        or entry.kind == "other"
        or (entry.kind == "dir" and entry.name in checks_mod.SKIP_DIRS)
    )


def list_tree(
    ws: Pinned, rel: str, rules: list[tuple[str, pathspec.GitIgnoreSpec]], count: _Count, hidden: _Hidden
) -> Listing:
    """List the directory `rel` as a tree keeps it: skipped directories and FIFOs, sockets and
    devices left out, and so are directories with nothing kept in them. What `.gitignore` hides
    is listed too, counted in `hidden` (not in `count`), one group where the hiding starts."""
    if rel.count("/") >= MAX_DEPTH:
        raise TooBig(f"the workspace has directories nested deeper than {MAX_DEPTH}; no diff is kept")
    entries, ignore = [], None
    try:
        for entry in ws.walk(rel or ".", recursive=False):
            entries.append(entry)
            if entry.name == ".gitignore" and entry.kind == "file":
                ignore = open_file_at(entry.dir_fd, entry.name, IGNORE_FILE_MAX_BYTES)
    except OSError:
        return {}  # swapped for a link or gone since its parent was listed
    if ignore:
        rules = [*rules, (rel, ignore_spec(ignore))]
    listing: Listing = {}
    for entry in entries:
        if _never_kept(entry):
            continue
        if entry.kind == "dir":
            if ignored(rules, entry.path, True):
                group = hidden.start(entry.path, is_dir=True)
                inner = _list_hidden(ws, entry.path, group, hidden) if group else {}
            else:
                inner = list_tree(ws, entry.path, rules, count, hidden)
            if inner:
                listing[entry.name] = inner
        elif ignored(rules, entry.path, False):
            group = hidden.start(entry.path, is_dir=False)
            if group:
                hidden.add(group, entry.size)
                listing[entry.name] = entry.kind
        else:
            count.add(entry.size)
            listing[entry.name] = entry.kind
    return listing


def _list_hidden(ws: Pinned, rel: str, group: _Group, hidden: _Hidden) -> Listing:
    """List the directory `rel`, which `.gitignore` hides, into `group`; stop once it is over the limits."""
    if rel.count("/") >= MAX_DEPTH:
        group.whole = False
        return {}
    try:
        entries = list(ws.walk(rel, recursive=False))
    except OSError:
        return {}
    listing: Listing = {}
    for entry in entries:
        if not group.whole:
            break
        if _never_kept(entry):
            continue
        if entry.kind == "dir":
            if inner := _list_hidden(ws, entry.path, group, hidden):
                listing[entry.name] = inner
        else:
            hidden.add(group, entry.size)
            listing[entry.name] = entry.kind
    return listing


def _leave_out(listing: Listing, path: str) -> None:
    """Take `path` out of `listing`, and the directories it leaves empty."""
    head, _, rest = path.partition("/")
    inner = listing.get(head)
    if not rest:
        listing.pop(head, None)
    elif isinstance(inner, dict):
        _leave_out(inner, rest)
        if not inner:
            listing.pop(head, None)


# --- storing: blobs and trees ---------------------------------------------------------

BlobKey = tuple[str, int, int, int, int]  # path, size, mtime, ctime, inode


@dataclass
class _Store:
    repo: pygit2.Repository
    ws: Pinned
    count: _Count
    known: dict[BlobKey, pygit2.Oid]  # the run's blobs from its last tree
    budget: int  # bytes read at most (the listing's limits, hidden files' included)
    kept: dict[BlobKey, pygit2.Oid] = field(default_factory=dict)  # this tree's, for the next
    read: int = 0

    def tree(self, rel: str, listing: Listing) -> pygit2.Oid | None:
        """Store the directory `rel` as a tree; None when nothing in it could be stored."""
        try:
            fd = self.ws.dir(rel or ".")
        except OSError:
            return None
        try:
            builder = self.repo.TreeBuilder()
            for name, what in listing.items():
                path = f"{rel}/{name}" if rel else name
                found: tuple[pygit2.Oid | None, int]
                if isinstance(what, dict):
                    found = self.tree(path, what), FileMode.TREE
                elif what == "link":
                    found = self.link(fd, name), FileMode.LINK
                else:
                    found = self.file(fd, name, path)
                if found[0] is None:
                    continue  # changed kind or gone since it was listed
                try:
                    builder.insert(name, found[0], found[1])
                except (pygit2.GitError, ValueError):  # a name libgit2 cannot store (not UTF-8, `.git`)
                    continue
            return builder.write() if len(builder) else None
        finally:
            os.close(fd)

    def link(self, fd: int, name: str) -> pygit2.Oid | None:
        try:
            return self.repo.create_blob(os.fsencode(os.readlink(name, dir_fd=fd)))
        except OSError:
            return None

    def file(self, fd: int, name: str, path: str) -> tuple[pygit2.Oid | None, int]:
        """Blob and mode of the regular file `name` in `fd`, read only when it changed since the last tree."""
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None, 0
        if not stat.S_ISREG(info.st_mode):
            return None, 0
        mode = FileMode.BLOB_EXECUTABLE if info.st_mode & stat.S_IXUSR else FileMode.BLOB
        key = (path, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
        blob = self.known.get(key)
        if blob is None:
            left = self.budget - self.read
            data = open_file_at(fd, name, left + 1)
            if data is None:
                return None, 0
            self.read += len(data)
            if len(data) > left:
                raise self.count.too_large()
            blob = self.repo.create_blob(data)
            if time.time_ns() - info.st_ctime_ns < RECENT_NS:
                return blob, mode
        self.kept[key] = blob
        return blob, mode


# Blobs by run: (the shadow directory's identity, {key: blob}), the most recently used last.
_known: OrderedDict[int, tuple[tuple[int, int], dict[BlobKey, pygit2.Oid]]] = OrderedDict()
_known_lock = threading.Lock()


def write_tree(gitdir: Path, run_id: int, ws: Pinned) -> str:
    """Store the workspace held open as `ws` as a tree in run `run_id`'s shadow directory `gitdir`; return its id.

    Raises TooBig over a limit: from the listing's sizes before anything is stored, or while
    reading when files grew since they were listed.
    """
    max_bytes, max_files = _limits()
    count = _Count(max_bytes, max_files)
    hidden = _Hidden(*_hidden_limits())
    listing = list_tree(ws, "", [], count, hidden)
    left_out = hidden.left_out()
    for group in left_out:
        _leave_out(listing, group.path)
    try:
        repo = open_repository(gitdir)
        head = os.stat(Path(repo.path) / "HEAD")
        identity = (head.st_ino, head.st_ctime_ns)  # a shadow directory made again starts with no blobs known
        with _known_lock:
            found = _known.get(run_id)
        known = found[1] if found and found[0] == identity else {}
        store = _Store(repo, ws, count, known, budget=max_bytes + hidden.max_bytes)
        tree = store.tree("", listing) or repo.TreeBuilder().write()
        _record_left_out(gitdir, str(tree), left_out, hidden)
    except (pygit2.GitError, OSError, ValueError) as exc:
        raise SnapshotError(f"git failed: {exc}") from None
    with _known_lock:
        _known[run_id] = (identity, store.kept)
        _known.move_to_end(run_id)
        while len(_known) > CACHED_RUNS:
            _known.popitem(last=False)
    return str(tree)


def _left_out_file(gitdir: Path, tree: str) -> Path:
    return gitdir / "tether-left-out" / tree


def _record_left_out(gitdir: Path, tree: str, left_out: list[_Group], hidden: _Hidden) -> None:
    """Keep, beside the tree, which hidden groups it leaves out (none: no record)."""
    path = _left_out_file(gitdir, tree)
    named = sorted([*(f"{g.path}/" if g.is_dir else g.path for g in left_out), *hidden.unwalked])
    if not named:
        path.unlink(missing_ok=True)
        return
    record = {
        "paths": named[:LEFT_OUT_NAMED],
        "more": max(len(named) - LEFT_OUT_NAMED, 0) + hidden.unwalked_more,
        "max_files": hidden.max_files,
        "max_bytes": hidden.max_bytes,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{tree}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)


def left_out_record(gitdir: Path, tree: str) -> dict[str, Any]:
    """The record of the hidden groups `tree` leaves out ({} when it leaves none out)."""
    try:
        found = json.loads(_left_out_file(gitdir, tree).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def open_repository(gitdir: Path) -> pygit2.Repository:
    """Open the run's shadow directory (made on first use), blind to the server's git configuration."""
    global _isolated
    with _isolating:  # libgit2's global options are set once, before any thread opens a repository
        if not _isolated:  # as `_git`'s environment does for git: no system, global or XDG configuration
            for level in (ConfigLevel.SYSTEM, ConfigLevel.XDG, ConfigLevel.GLOBAL, ConfigLevel.PROGRAMDATA):
                pygit2.settings.search_path[level] = ""
            _isolated = True
    if not (gitdir / "HEAD").exists():
        gitdir.mkdir(parents=True, exist_ok=True)
        pygit2.init_repository(str(gitdir), bare=True)
        # The directories left out, for git itself given this directory and a work tree (checking by hand).
        exclude = gitdir / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("".join(f"{name}/\n" for name in sorted(checks_mod.SKIP_DIRS)))
    return pygit2.Repository(str(gitdir))


_isolated = False
_isolating = threading.Lock()
