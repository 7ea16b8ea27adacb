"""Protected evidence: the files that grade an agent, fingerprinted so a change to them is seen.

An instance's `protected_paths` are globs relative to its workspace. A glob without a `/`
matches a file's name in any directory (`test_*.py`, `conftest.py`, like a `.gitignore` line);
a glob with one is anchored at the workspace root and `**` spans directories (`tests/**`).
`digests(workspace, globs)` reads the matching files (the runner takes them before the first act
and again after every act; the directories the workspace fingerprint skips, caches included, are
skipped here too); `compare(baseline, current)` is pure and says which protected files were
modified, added or deleted. A run whose protected files changed is never verified by the machine
alone (see `loops.policy.verdict`).

Reads files; no database. Special files (FIFOs, devices) are never opened; a symbolic
link is digested as its target's name, so swapping a test for a link to elsewhere is a change.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path, PurePosixPath

# Directories never walked: the same ones the workspace fingerprint and the snapshots skip.
from loops.checks import SKIP_DIRS

MAX_WALKED = 20_000  # entries looked at per fingerprint
MAX_PROTECTED = 2_000  # protected files digested per fingerprint
# Stands in for the files past a limit: a workspace that grows past it after the start has changed
# what could be checked, which counts as a change.
TRUNCATED = "(more files than could be checked)"


def _clean(glob: str) -> str:
    glob = glob.strip().replace("\\", "/")
    while glob.startswith("./"):
        glob = glob[2:]
    return glob.lstrip("/")


def _full_match(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    """Match path segments against glob segments; `**` stands for any number of segments.

    Polynomial whatever the pattern (each (segment, glob segment) pair is decided once).
    """

    @cache
    def at(i: int, j: int) -> bool:
        if j == len(pattern):
            return i == len(parts)
        if pattern[j] == "**":
            return at(i, j + 1) or (i < len(parts) and at(i + 1, j))
        return i < len(parts) and fnmatchcase(parts[i], pattern[j]) and at(i + 1, j + 1)

    return at(0, 0)


def matches(path: str, globs: Iterable[str]) -> bool:
    """Return whether the workspace-relative `path` (with `/` separators) is protected by `globs`."""
    parts = PurePosixPath(path).parts
    for raw in globs:
        glob = _clean(str(raw))
        if not glob or not parts:
            continue
        if "/" not in glob.rstrip("/"):
            if glob.endswith("/"):
                # A bare directory name ("tests/") protects everything under a directory of that name.
                if any(fnmatchcase(part, glob.rstrip("/")) for part in parts[:-1]):
                    return True
            elif fnmatchcase(parts[-1], glob):
                return True
        else:
            pattern = [p for p in glob.rstrip("/").split("/") if p] + (["**"] if glob.endswith("/") else [])
            if _full_match(parts, pattern):
                return True
    return False


def _digest(path: Path) -> str:
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return "symlink:" + os.readlink(path)
        if not stat.S_ISREG(info.st_mode):
            return f"special:{stat.S_IFMT(info.st_mode):o}"
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        return f"unreadable:{exc.errno}"


def digests(workspace: Path, globs: Iterable[str]) -> dict[str, str]:
    """Return {workspace-relative path: sha256} of every protected file in `workspace` (bounded)."""
    globs = [g for g in (str(g) for g in globs) if _clean(g)]
    found: dict[str, str] = {}
    if not globs or not workspace.is_dir():
        return found
    walked = 0
    for root, dirs, files in os.walk(workspace):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        # A symbolic link to a directory is not walked into: it is an entry of its own.
        entries = sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in entries:
            walked += 1
            if walked > MAX_WALKED or len(found) >= MAX_PROTECTED:
                found[TRUNCATED] = TRUNCATED
                return found
            path = Path(root) / name
            relative = path.relative_to(workspace).as_posix()
            if matches(relative, globs):
                found[relative] = _digest(path)
    return found


@dataclass(frozen=True)
class Changes:
    """The protected files that differ from the run's start."""

    modified: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.modified, *self.added, *self.deleted}))

    def __bool__(self) -> bool:
        return bool(self.modified or self.added or self.deleted)

    def as_json(self) -> dict[str, list[str]]:
        return {"modified": list(self.modified), "added": list(self.added), "deleted": list(self.deleted)}


def compare(
    baseline: Mapping[str, str], current: Mapping[str, str], globs: Iterable[str] | None = None
) -> Changes:
    """Return how `current` differs from `baseline`. Pure.

    With `globs`, only paths those globs protect count (a glob added mid-run does not make its
    files "added", one removed stops counting).
    """
    if globs is not None:
        globs = list(globs)
        baseline = {p: d for p, d in baseline.items() if p == TRUNCATED or matches(p, globs)}
        current = {p: d for p, d in current.items() if p == TRUNCATED or matches(p, globs)}
    return Changes(
        modified=tuple(sorted(p for p in baseline.keys() & current.keys() if baseline[p] != current[p])),
        added=tuple(sorted(current.keys() - baseline.keys())),
        deleted=tuple(sorted(p for p in baseline.keys() - current.keys() if p != TRUNCATED)),
    )
