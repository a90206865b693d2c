"""What a SQLite storage error meant, said from the file system rather than guessed.

SQLite reports a full file system that stopped it growing a WAL file's shared-memory
index as ``SQLITE_IOERR_SHMSIZE``, "disk I/O error" (a probe: a SQLite cell on a full
file system failed every read and write so, naming nothing), and a file on a file system
mounted read-only as "attempt to write a readonly database". For errors of those codes
the file system holding the file is asked (``statvfs``): mounted read-only, or with less
than ``LOW_FREE`` bytes free, it is said after SQLite's own words. Used by the cells'
databases and the embedded index alike.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

LOW_FREE = 1 << 20  # bytes: less is reported, with the figure
_STORAGE_CODES = frozenset(
    {sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN}
)


def storage_state(path: Path) -> str | None:
    """The file system holding ``path`` (or its directory, if the file is not there), in
    words, when it is mounted read-only or nearly full; None when neither, or unknown."""
    try:
        stat = os.statvfs(path if path.exists() else path.parent)
    except OSError:
        return None
    return described(path, stat)


def described(path: Path, stat: os.statvfs_result) -> str | None:
    """``storage_state`` from the file system's figures."""
    if stat.f_flag & os.ST_RDONLY:
        return f"the file system holding {path} is mounted read-only"
    free = stat.f_bavail * stat.f_frsize
    if free < LOW_FREE:
        return f"the file system holding {path} is full, {free:,} bytes free"
    return None


def explained(exc: BaseException, path: Path | None) -> str | None:
    """``storage_state`` of ``path`` when ``exc`` is a SQLite error about storage."""
    code = getattr(exc, "sqlite_errorcode", None)
    if path is None or not isinstance(exc, sqlite3.Error) or not isinstance(code, int):
        return None
    return storage_state(path) if code & 0xFF in _STORAGE_CODES else None
