"""File tools confined to an instance's workspace: list, read, write, edit, search.

Every call works through the workspace's directory held open (`instances.pinned`), never a
path string: `..` components and paths outside the workspace are refused, a symlink anywhere
on a path is refused (a listing shows it as a link), and only regular files are read or
written, so a FIFO or a device cannot hang the call. The refusals are `WorkspaceError`s whose
message is fit to show the model. Output is capped so one call cannot flood the context.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from instances.pinned import Pinned, Refused, open_file_at

MAX_READ_BYTES = 64 * 1024
MAX_WRITE_BYTES = 1024 * 1024
MAX_SOURCE_BYTES = 16 * 1024 * 1024  # what read_file looks at, at most (offset/limit within it)
MAX_SEARCH_FILE_BYTES = 4 * 1024 * 1024
MAX_LIST_ENTRIES = 500
MAX_MATCHES = 200
MAX_LINE_CHARS = 300
SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv", ".mypy_cache", ".ruff_cache"})


class WorkspaceError(Exception):
    """A refused or failed file operation; the message is shown to the model."""


@contextmanager
def pinned(root: Path | Pinned) -> Iterator[Pinned]:
    """The workspace held open (`root` itself when it already is), its refusals as WorkspaceErrors."""
    try:
        if isinstance(root, Pinned):
            yield root
        else:
            with Pinned(Path(root).resolve()) as ws:
                yield ws
    except Refused as exc:
        raise WorkspaceError(f"refused {exc}") from None
    except FileNotFoundError as exc:
        raise WorkspaceError(f"{exc.filename or 'that path'!r} does not exist") from None


def relative(ws: Pinned, path: str) -> str:
    """Return `path` relative to the workspace, or raise WorkspaceError (paths are never resolved)."""
    if not isinstance(path, str):
        raise WorkspaceError("path must be a string")
    if "\x00" in path:
        raise WorkspaceError("path must not contain NUL bytes")
    raw = path.strip() or "."
    if raw.startswith("~"):
        raise WorkspaceError(f"refused {path!r}: paths are relative to the workspace; '~' is not allowed")
    parts = Path(raw).parts
    if ".." in parts:
        raise WorkspaceError(f"refused {path!r}: '..' is not allowed; paths stay inside the workspace")
    if Path(raw).is_absolute():
        if not Path(raw).is_relative_to(ws.path):
            raise WorkspaceError(f"refused {path!r}: absolute paths outside the workspace are not allowed")
        raw = str(Path(raw).relative_to(ws.path))
    return raw or "."


def _kind(ws: Pinned, rel: str, path: str) -> str:
    kind = ws.kind(rel)
    if kind is None:
        raise WorkspaceError(f"{path!r} does not exist")
    if kind == "link":
        raise WorkspaceError(f"refused {path!r}: it is or passes through a symlink, which is never followed")
    return kind


def list_files(root: Path | Pinned, path: str = ".", *, recursive: bool = False) -> str:
    """Return the entries under `path`, one a line: directories end in '/', files show their size."""
    with pinned(root) as ws:
        rel = relative(ws, path)
        if _kind(ws, rel, path) != "dir":
            raise WorkspaceError(f"{path!r} is a file, not a directory")
        lines: list[str] = []
        for entry in ws.walk(rel, skip=SKIP_DIRS, recursive=recursive):
            if entry.kind == "dir" and entry.name in SKIP_DIRS:
                continue
            lines.append({
                "dir": f"{entry.path}/",
                "link": f"{entry.path} -> (symlink)",
                "file": f"{entry.path}  {entry.size} bytes",
            }.get(entry.kind, f"{entry.path}  (not a regular file)"))
            if len(lines) >= MAX_LIST_ENTRIES:
                lines.append(f"… listing stopped at {MAX_LIST_ENTRIES} entries")
                return "\n".join(lines)
        return "\n".join(lines) if lines else f"{rel} is empty"


def read_file(root: Path | Pinned, path: str, *, offset: int = 1, limit: int | None = None) -> str:
    """Return the text of a file (optionally lines offset..offset+limit-1), capped."""
    with pinned(root) as ws:
        rel = relative(ws, path)
        if _kind(ws, rel, path) != "file":
            raise WorkspaceError(f"{path!r} is not a file")
        data, size = ws.read(rel, MAX_SOURCE_BYTES)
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
    elif size > len(data):
        text += f"\n… the file is {size} bytes; only its first {len(data)} are read"
    return text


def write_file(root: Path | Pinned, path: str, content: str) -> str:
    """Write `content` to a file (creating directories), and say what was written."""
    if not isinstance(content, str):
        raise WorkspaceError("content must be a string")
    encoded = content.encode()
    if len(encoded) > MAX_WRITE_BYTES:
        raise WorkspaceError(f"refused: content is {len(encoded)} bytes; the limit is {MAX_WRITE_BYTES}")
    with pinned(root) as ws:
        rel = relative(ws, path)
        if ws.kind(rel) == "dir":
            raise WorkspaceError(f"{path!r} is a directory")
        ws.write(rel, encoded)
    return f"wrote {len(encoded)} bytes to {rel}"


def edit_file(root: Path | Pinned, path: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` with `new` in a file."""
    if not old:
        raise WorkspaceError("old_text must not be empty; use write_file to create a file")
    with pinned(root) as ws:
        rel = relative(ws, path)
        if _kind(ws, rel, path) != "file":
            raise WorkspaceError(f"{path!r} is not a file")
        data, size = ws.read(rel, MAX_WRITE_BYTES + 1)
        if size > MAX_WRITE_BYTES:
            raise WorkspaceError(f"{path!r} is too large to edit; the limit is {MAX_WRITE_BYTES} bytes")
        current = data.decode("utf-8", errors="replace")
        count = current.count(old)
        if count == 0:
            raise WorkspaceError(f"old_text was not found in {path!r}")
        if count > 1:
            raise WorkspaceError(f"old_text occurs {count} times in {path!r}; give more context so it is unique")
        write_file(ws, rel, current.replace(old, new, 1))
    return f"edited {path}"


def search_files(root: Path | Pinned, pattern: str, path: str = ".", *, regex: bool = False) -> str:
    """Return 'file:line: text' for each line under `path` matching `pattern`, capped."""
    if not pattern:
        raise WorkspaceError("pattern must not be empty")
    try:
        matcher = re.compile(pattern if regex else re.escape(pattern))
    except re.error as exc:
        raise WorkspaceError(f"invalid regular expression: {exc}") from None
    hits: list[str] = []
    with pinned(root) as ws:
        rel = relative(ws, path)
        kind = _kind(ws, rel, path)
        files = [(rel, ws.read(rel, MAX_SEARCH_FILE_BYTES)[0])] if kind == "file" else []
        if kind == "dir":
            files = (
                (entry.path, open_file_at(entry.dir_fd, entry.name, MAX_SEARCH_FILE_BYTES))
                for entry in ws.walk(rel, skip=SKIP_DIRS)
                if entry.kind == "file"
            )
        for name, data in files:
            if data is None or b"\x00" in data[:8192]:
                continue
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                if matcher.search(line[:10_000]):
                    hits.append(f"{name}:{number}: {line[:MAX_LINE_CHARS]}")
                    if len(hits) >= MAX_MATCHES:
                        hits.append(f"… stopped at {MAX_MATCHES} matches")
                        return "\n".join(hits)
    return "\n".join(hits) if hits else "no matches"

