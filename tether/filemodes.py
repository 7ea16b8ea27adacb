"""Keep Tether's own files private to the OS user it runs as.

`TETHER_HOME` (secret key, database, workspaces, snapshots, cache) is 0700 and the SQLite
database files 0600, whatever the umask: created so, and tightened when found looser — only
when this user owns them (another owner's file is left as it is; the OS would refuse anyway).
SQLite creates its `-wal` and `-shm` files with the database file's own mode, so a 0600
database keeps them 0600 too; existing ones are tightened as well. Imported by the settings:
no Django here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def _tighten(path: Path, mode: int) -> None:
    try:
        found = path.stat()
    except FileNotFoundError:
        return
    if found.st_uid == os.geteuid() and stat.S_IMODE(found.st_mode) & ~mode:
        path.chmod(stat.S_IMODE(found.st_mode) & mode)


def private_directory(path: Path) -> Path:
    """Create `path` (and its parents) if missing; make it 0700. Return it.

    A shared directory (sticky bit, like /tmp) is never changed: the files Tether keeps in it
    are private on their own.
    """
    path.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
    if not path.stat().st_mode & stat.S_ISVTX:
        _tighten(path, DIRECTORY_MODE)
    return path


def private_database(name: str) -> str:
    """Create the SQLite file `name` empty and 0600 if missing; tighten it and its -wal/-shm. Return `name`.

    In-memory and URI names are left alone; so is a file that cannot be created here
    (SQLite reports that itself when it connects).
    """
    if not name or name == ":memory:" or name.startswith("file:"):
        return name
    path = Path(name)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass
    except OSError:
        return name
    for each in (path, Path(f"{name}-wal"), Path(f"{name}-shm"), Path(f"{name}-journal")):
        _tighten(each, FILE_MODE)
    return name
