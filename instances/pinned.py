"""Host-side work on a workspace through descriptors opened once: never a path string again.

An agent's programs can rename, swap and symlink anything in its workspace while the server
works on it, and the server may run as root. So every host-side operation on a workspace
(the file tools, the fingerprint, the snapshot, the delegation copy and its patch, a rollback's
restore, ownership changes, the usage file, the sandbox's bind mount) starts from the workspace's directory opened
once (`Pinned`), and reaches everything under it one component at a time with `O_NOFOLLOW`:

- a symlink is reported as a link and never followed, wherever it is on the path;
- only regular files and directories are opened: a FIFO, a socket or a device is refused
  after an `O_NONBLOCK` open and an `fstat`, so nothing can hang a worker thread;
- every read is bounded by its caller's limit, so a sparse or endless file costs no more
  than the limit;
- a directory swapped for a symlink after it was opened changes nothing: the descriptor
  still names the directory that was opened.

The workspace's own path is walked the same way from `/` when it is pinned (the path is the
real path `sandbox.checked_workspace` returned): if any component is a symlink by then, it was
swapped since the check, and the workspace is refused.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# Directories a workspace's fingerprint, its protected digests and its snapshots never walk.
SKIP_DIRS = frozenset({".git", "__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache", "node_modules", ".venv"})

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(OSError):
    """A path the host will not follow or a file it will not open; the message says which and why."""


def _parts(relative: str) -> list[str]:
    """The components of a workspace-relative path; `..` and absolute paths are refused."""
    if "\x00" in relative:
        raise Refused(f"{relative!r}: a path must not contain NUL bytes")
    path = PurePosixPath(relative)
    if path.is_absolute():
        raise Refused(f"{relative!r}: paths are relative to the workspace")
    parts = [p for p in path.parts if p != "."]
    if ".." in parts:
        raise Refused(f"{relative!r}: '..' is not allowed; paths stay inside the workspace")
    return parts


def _open_dir_at(parent: int, name: str, relative: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError as exc:
        link = exc.errno == errno.ELOOP or (  # O_DIRECTORY | O_NOFOLLOW on a link: ENOTDIR
            exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        )
        if link:
            raise Refused(f"{relative!r} passes through a symlink, which is never followed") from None
        raise


def _descend(fd: int, parts: list[str], relative: str, *, create: bool = False, mode: int = 0o755) -> int:
    """From the directory `fd` (taken over), open each of `parts` in turn, never through a link."""
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            step = _open_dir_at(fd, part, relative)
            os.close(fd)
            fd = step
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_dir(path: Path) -> int:
    """Open the directory at the absolute `path`, refusing a symlink on any component; return its fd."""
    return _descend(os.open("/", _DIR), list(Path(path).parts[1:]), str(path))


@dataclass
class Entry:
    """One directory entry, read without following it: `kind` is 'dir', 'file', 'link' or 'other'."""

    path: str  # relative to the workspace
    name: str
    kind: str
    size: int = 0
    dir_fd: int = field(default=-1, repr=False)  # the directory holding it (valid while walking)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


class Pinned:
    """A workspace directory held open; every operation below it goes through its descriptor.

    Use as a context manager (`with Pinned(path) as ws:`), or `Pinned.adopt(fd)`. `path` is
    what it is called in messages and the sandbox; the descriptor is what is worked on.
    """

    def __init__(self, path: Path, fd: int | None = None) -> None:
        self.path = Path(path)
        self.fd = open_dir(self.path) if fd is None else fd

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def proc_path(self) -> str:
        """A path naming the pinned directory itself, for a program that takes only paths (git)."""
        return f"/proc/self/fd/{self.fd}"

    # --- directories ------------------------------------------------------------------

    def dir(self, relative: str = ".", *, create: bool = False, mode: int = 0o755) -> int:
        """Open the directory `relative` (creating missing ones when `create`); the caller closes it."""
        return _descend(os.dup(self.fd), _parts(relative), relative, create=create, mode=mode)

    def lstat(self, relative: str) -> os.stat_result | None:
        """The entry's own stat (a link's, never its target's); None when it does not exist."""
        parts = _parts(relative)
        if not parts:
            return os.fstat(self.fd)
        parent = self.dir("/".join(parts[:-1]) or ".")
        try:
            return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(parent)

    def kind(self, relative: str) -> str | None:
        """'dir', 'file', 'link', 'other', or None when nothing is there."""
        try:
            found = self.lstat(relative)
        except Refused:
            return "link"
        except (NotADirectoryError, FileNotFoundError):
            return None
        return None if found is None else _kind(found.st_mode)

    # --- files ------------------------------------------------------------------------

    def open(self, relative: str, flags: int = os.O_RDONLY, mode: int = 0o644, *, create_dirs: bool = False) -> int:
        """Open the regular file `relative` (never through a symlink, never a FIFO or device); return its fd."""
        parts = _parts(relative)
        if not parts:
            raise Refused(f"{relative!r} is the workspace itself, not a file")
        parent = self.dir("/".join(parts[:-1]) or ".", create=create_dirs)
        try:
            try:
                fd = os.open(parts[-1], flags | _FILE, mode, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Refused(f"{relative!r} is a symlink, which is never followed") from None
                if exc.errno == errno.EISDIR:
                    raise Refused(f"{relative!r} is a directory") from None
                if exc.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
                    raise Refused(f"{relative!r} is not a regular file") from None
                raise
        finally:
            os.close(parent)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise Refused(f"{relative!r} is not a regular file ({_kind(info.st_mode)}); it is not opened")
        os.set_blocking(fd, True)
        return fd

    def read(self, relative: str, limit: int) -> tuple[bytes, int]:
        """Return up to `limit` bytes of the regular file `relative`, and its size."""
        fd = self.open(relative)
        try:
            return read_bounded(fd, limit), os.fstat(fd).st_size
        finally:
            os.close(fd)

    def write(self, relative: str, data: bytes, *, mode: int = 0o644, create_dirs: bool = True) -> None:
        """Write `data` to the regular file `relative` (created, or truncated: never through a link)."""
        fd = self.open(relative, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, create_dirs=create_dirs)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    # --- replacing and removing entries (a rollback) ----------------------------------

    def replace(
        self, relative: str, *, data: bytes | None = None, link: str | None = None, mode: int = 0o644
    ) -> None:
        """Put a new regular file (`data`) or symlink (`link`) at `relative`, in place of whatever entry is there.

        Written under a fresh name in the parent directory (opened without following a link,
        created when missing) and renamed over the old entry: a symlink there is replaced, not
        followed; a hardlink's other names keep their content; a directory there is refused.
        Made as root, the new entry belongs to the workspace's owner.
        """
        parts = _parts(relative)
        if not parts:
            raise Refused(f"{relative!r} is the workspace itself, not a file")
        parent = self.dir("/".join(parts[:-1]) or ".", create=True)
        name, temporary = parts[-1], f".tether-restore-{secrets.token_hex(8)}"
        try:
            owner = os.fstat(self.fd)
            if link is not None:
                os.symlink(link, temporary, dir_fd=parent)
            else:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE, mode, dir_fd=parent)
                try:
                    view = memoryview(data or b"")
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
            if os.geteuid() == 0 and owner.st_uid != 0:
                os.chown(temporary, owner.st_uid, owner.st_gid, dir_fd=parent, follow_symlinks=False)
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise Refused(f"{relative!r} is a directory now; it is not replaced")
            except FileNotFoundError:
                pass
            os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=parent)
            except OSError:
                pass
            raise
        finally:
            os.close(parent)

    def remove(self, relative: str) -> None:
        """Remove the file, symlink or other non-directory entry `relative` (a link itself, never its target)."""
        parts = _parts(relative)
        if not parts:
            raise Refused(f"{relative!r} is the workspace itself")
        parent = self.dir("/".join(parts[:-1]) or ".")
        try:
            if stat.S_ISDIR(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode):
                raise Refused(f"{relative!r} is a directory now; it is not removed")
            os.unlink(parts[-1], dir_fd=parent)
        finally:
            os.close(parent)

    def remove_empty_dir(self, relative: str) -> bool:
        """Remove the directory `relative` if it is empty; return whether it was removed."""
        parts = _parts(relative)
        if not parts:
            return False
        parent = self.dir("/".join(parts[:-1]) or ".")
        try:
            os.rmdir(parts[-1], dir_fd=parent)  # a link or a file there: ENOTDIR, never followed
        except OSError:
            return False
        finally:
            os.close(parent)
        return True

    # --- walking ----------------------------------------------------------------------

    def walk(
        self, relative: str = ".", *, skip: frozenset[str] = frozenset(), recursive: bool = True
    ) -> Iterator[Entry]:
        """Yield every entry under `relative`, sorted, depth first; links and others are yielded, not followed.

        A directory named in `skip` is yielded but not entered. Each entry's `dir_fd` is open
        while it is yielded.
        """
        top = self.dir(relative)
        base = "/".join(_parts(relative))
        yield from self._walk(top, base, skip, recursive)

    def _walk(self, fd: int, base: str, skip: frozenset[str], recursive: bool) -> Iterator[Entry]:
        try:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for item in entries:
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                path = f"{base}/{item.name}" if base else item.name
                entry = Entry(path, item.name, _kind(info.st_mode), info.st_size, fd)
                yield entry
                if entry.kind == "dir" and recursive and item.name not in skip:
                    try:
                        child = _open_dir_at(fd, item.name, path)
                    except OSError:
                        continue  # swapped for a link or gone since it was listed: not entered
                    yield from self._walk(child, path, skip, recursive)
        finally:
            os.close(fd)


def read_bounded(fd: int, limit: int) -> bytes:
    """Read at most `limit` bytes from `fd`."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def open_file_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Read up to `limit` bytes of the regular file `name` in `dir_fd`; None when it is anything else."""
    fd = _open_regular_at(dir_fd, name)
    if fd is None:
        return None
    try:
        return read_bounded(fd, limit)
    finally:
        os.close(fd)


def _open_regular_at(dir_fd: int, name: str) -> int | None:
    try:
        fd = os.open(name, os.O_RDONLY | _FILE, dir_fd=dir_fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


def copy_tree(source: Pinned, target: Pinned) -> None:
    """Copy everything under `source` into `target`: links as links, FIFOs and devices left out."""
    for entry in source.walk():
        parent = str(PurePosixPath(entry.path).parent)
        if entry.kind == "dir":
            os.close(target.dir(entry.path, create=True))
        elif entry.kind == "link":
            into = target.dir(parent, create=True)
            try:
                os.symlink(os.readlink(entry.name, dir_fd=entry.dir_fd), entry.name, dir_fd=into)
            except OSError:
                pass
            finally:
                os.close(into)
        elif entry.kind == "file" and (fd := _open_regular_at(entry.dir_fd, entry.name)) is not None:
            try:
                mode = os.fstat(fd).st_mode & 0o777
                out = target.open(entry.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, create_dirs=True)
                with open(fd, "rb", closefd=False) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            finally:
                os.close(fd)


def chown_tree(root: int, uid: int) -> None:
    """Make everything under the directory `root` (and it) owned by `uid`, never through a link."""
    if os.fstat(root).st_uid != uid:
        os.fchown(root, uid, uid)
    pinned = Pinned(Path("."), fd=os.dup(root))
    try:
        for entry in pinned.walk():
            try:
                if os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False).st_uid != uid:
                    os.chown(entry.name, uid, uid, dir_fd=entry.dir_fd, follow_symlinks=False)
            except OSError:
                pass
    finally:
        pinned.close()
