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
from typing import Any

# Directories never walked: the same ones the workspace fingerprint and the snapshots skip.
from instances import sandbox
from instances.pinned import Entry, open_file_at

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


# What grades an agent wherever there are checks: one set, for every template and instance (a
# template adds its own globs to it, never copies it). Tests and the configuration every runner
# Tether knows reads (pytest: pytest.ini, .pytest.ini, pyproject.toml, setup.cfg, tox.ini,
# conftest.py at any depth; unittest: the test files themselves), the runner's own modules if the
# workspace shadowed them, sourceless bytecode, the start-up hooks Python reads, and .gitignore
# (which decides what a review's diff shows by default).
DEFAULT_GLOBS = (
    "tests/", "test/", "test_*.py", "*_test.py", "conftest.py",
    "pytest.ini", ".pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini", "noxfile.py",
    "pytest.py", "pytest/", "_pytest.py", "_pytest/", "pluggy.py", "pluggy/", "iniconfig.py", "iniconfig/",
    "unittest.py", "unittest/", "py.py", "*.pyc",
    "sitecustomize.py", "usercustomize.py", "*.pth",
    ".gitignore",
)


def globs_for(instance: Any) -> list[str]:
    """What is protected on `instance`: its own globs, and with checks the shared defaults.

    An instance without checks has no evidence to protect beyond what it lists; one with checks
    gets `DEFAULT_GLOBS` unless it opted out (`protect_defaults` false).
    """
    own = [str(glob) for glob in instance.protected_paths or []]
    checks = list(instance.checks or [])
    if not checks or not getattr(instance, "protect_defaults", True):
        return own
    return list(dict.fromkeys([*DEFAULT_GLOBS, *own]))


MAX_DIGEST_BYTES = 64 * 1024 * 1024  # of each protected file (its size is in the digest too)


def _digest(entry: Entry) -> str:
    """A protected entry's digest, read through its directory's descriptor: a link by its target's name."""
    try:
        if entry.kind == "link":
            return "symlink:" + os.readlink(entry.name, dir_fd=entry.dir_fd)
        info = os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False)
        data = open_file_at(entry.dir_fd, entry.name, MAX_DIGEST_BYTES) if entry.kind == "file" else None
        if data is None:
            return f"special:{stat.S_IFMT(info.st_mode):o}"
        digest = hashlib.sha256(data).hexdigest()
        return digest if info.st_size <= MAX_DIGEST_BYTES else f"{digest}+{info.st_size}"
    except OSError as exc:
        return f"unreadable:{exc.errno}"


def digests(workspace: Path, globs: Iterable[str]) -> dict[str, str]:
    """Return {workspace-relative path: sha256} of every protected file in `workspace` (bounded).

    Walked through the workspace held open (`instances.pinned`); a link is an entry of its own,
    never followed.
    """
    globs = [g for g in (str(g) for g in globs) if _clean(g)]
    found: dict[str, str] = {}
    if not globs:
        return found
    with sandbox.workspace_files(workspace) as files:
        for walked, entry in enumerate(files or (), start=1):
            if walked > MAX_WALKED or len(found) >= MAX_PROTECTED:
                found[TRUNCATED] = TRUNCATED
                return found
            if matches(entry.path, globs):
                found[entry.path] = _digest(entry)
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
