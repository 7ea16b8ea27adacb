"""File tools confined to an instance's workspace: list, read, write, edit, search.

Reads and writes files under one root only. Every path an agent gives is taken relative
to the workspace; `..` components, absolute paths outside the workspace and symlinks
that resolve outside it are refused with a `WorkspaceError` whose message is fit to
show the model. Output is capped so one call cannot flood the context.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MAX_READ_BYTES = 64 * 1024
MAX_WRITE_BYTES = 1024 * 1024
MAX_LIST_ENTRIES = 500
MAX_MATCHES = 200
MAX_LINE_CHARS = 300
SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv", ".mypy_cache", ".ruff_cache"})


class WorkspaceError(Exception):
    """A refused or failed file operation; the message is shown to the model."""


def confine(root: Path, path: str) -> Path:
    """Return the resolved absolute path of `path` inside `root`, or raise WorkspaceError."""
    if not isinstance(path, str):
        raise WorkspaceError("path must be a string")
    if "\x00" in path:
        raise WorkspaceError("path must not contain NUL bytes")
    raw = path.strip() or "."
    if raw.startswith("~"):
        raise WorkspaceError(f"refused {path!r}: paths are relative to the workspace; '~' is not allowed")
    if ".." in Path(raw).parts:
        raise WorkspaceError(f"refused {path!r}: '..' is not allowed; paths stay inside the workspace")
    base = root.resolve()
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = base / candidate
    resolved = candidate.resolve()
    if not resolved.is_relative_to(base):
        if Path(raw).is_absolute() and not candidate.is_relative_to(base):
            raise WorkspaceError(f"refused {path!r}: absolute paths outside the workspace are not allowed")
        raise WorkspaceError(f"refused {path!r}: it leads outside the workspace (through a symlink)")
    return resolved


def _display(root: Path, path: Path) -> str:
    rel = path.relative_to(root.resolve())
    return str(rel) if str(rel) != "." else "."


def list_files(root: Path, path: str = ".", *, recursive: bool = False) -> str:
    """Return the entries under `path`, one a line: directories end in '/', files show their size."""
    target = confine(root, path)
    if not target.exists():
        raise WorkspaceError(f"{path!r} does not exist")
    if not target.is_dir():
        raise WorkspaceError(f"{path!r} is a file, not a directory")
    lines: list[str] = []
    base = root.resolve()
    for current, dirs, files in os.walk(target, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        here = Path(current)
        for name in [*dirs, *sorted(files)]:
            entry = here / name
            rel = entry.relative_to(base)
            if entry.is_symlink():
                lines.append(f"{rel} -> (symlink)")
            elif entry.is_dir():
                lines.append(f"{rel}/")
            else:
                try:
                    lines.append(f"{rel}  {entry.stat().st_size} bytes")
                except OSError:
                    lines.append(f"{rel}")
            if len(lines) >= MAX_LIST_ENTRIES:
                lines.append(f"… listing stopped at {MAX_LIST_ENTRIES} entries")
                return "\n".join(lines)
        if not recursive:
            break
    return "\n".join(lines) if lines else f"{_display(root, target)} is empty"


def read_file(root: Path, path: str, *, offset: int = 1, limit: int | None = None) -> str:
    """Return the text of a file (optionally lines offset..offset+limit-1), capped."""
    target = confine(root, path)
    if not target.is_file():
        raise WorkspaceError(f"{path!r} does not exist" if not target.exists() else f"{path!r} is not a file")
    data = target.read_bytes()
    if b"\x00" in data[:8192]:
        raise WorkspaceError(f"{path!r} looks binary; only text files can be read")
    text = data.decode("utf-8", errors="replace")
    if offset > 1 or limit is not None:
        lines = text.splitlines(keepends=True)
        start = max(offset, 1) - 1
        end = len(lines) if limit is None else start + max(limit, 0)
        text = "".join(lines[start:end])
    encoded = text.encode()
    if len(encoded) > MAX_READ_BYTES:
        text = encoded[:MAX_READ_BYTES].decode("utf-8", errors="ignore")
        text += f"\n… truncated at {MAX_READ_BYTES} bytes; read further with offset/limit"
    return text


def write_file(root: Path, path: str, content: str) -> str:
    """Write `content` to a file (creating directories), and say what was written."""
    if not isinstance(content, str):
        raise WorkspaceError("content must be a string")
    encoded = content.encode()
    if len(encoded) > MAX_WRITE_BYTES:
        raise WorkspaceError(f"refused: content is {len(encoded)} bytes; the limit is {MAX_WRITE_BYTES}")
    target = confine(root, path)
    if target == root.resolve() or target.is_dir():
        raise WorkspaceError(f"{path!r} is a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Re-check after mkdir: a directory created on the way must still be inside.
    confine(root, str(target.relative_to(root.resolve())))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(encoded)
    return f"wrote {len(encoded)} bytes to {_display(root, target)}"


def edit_file(root: Path, path: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` with `new` in a file."""
    if not old:
        raise WorkspaceError("old_text must not be empty; use write_file to create a file")
    target = confine(root, path)
    if not target.is_file():
        raise WorkspaceError(f"{path!r} does not exist" if not target.exists() else f"{path!r} is not a file")
    if target.stat().st_size > MAX_WRITE_BYTES:
        raise WorkspaceError(f"{path!r} is too large to edit; the limit is {MAX_WRITE_BYTES} bytes")
    current = target.read_text(encoding="utf-8", errors="replace")
    count = current.count(old)
    if count == 0:
        raise WorkspaceError(f"old_text was not found in {path!r}")
    if count > 1:
        raise WorkspaceError(f"old_text occurs {count} times in {path!r}; give more context so it is unique")
    write_file(root, path, current.replace(old, new, 1))
    return f"edited {path}"


def search_files(root: Path, pattern: str, path: str = ".", *, regex: bool = False) -> str:
    """Return 'file:line: text' for each line under `path` matching `pattern`, capped."""
    if not pattern:
        raise WorkspaceError("pattern must not be empty")
    try:
        matcher = re.compile(pattern if regex else re.escape(pattern))
    except re.error as exc:
        raise WorkspaceError(f"invalid regular expression: {exc}") from None
    target = confine(root, path)
    if not target.exists():
        raise WorkspaceError(f"{path!r} does not exist")
    base = root.resolve()
    files = [target] if target.is_file() else []
    if target.is_dir():
        for current, dirs, names in os.walk(target, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            files.extend(Path(current) / n for n in sorted(names))
    hits: list[str] = []
    for file in files:
        if file.is_symlink() or not file.is_file():
            continue
        try:
            data = file.read_bytes()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if matcher.search(line[:10_000]):
                hits.append(f"{file.relative_to(base)}:{number}: {line[:MAX_LINE_CHARS]}")
                if len(hits) >= MAX_MATCHES:
                    hits.append(f"… stopped at {MAX_MATCHES} matches")
                    return "\n".join(hits)
    return "\n".join(hits) if hits else "no matches"
