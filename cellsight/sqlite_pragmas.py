"""A pragma that SQLite answers "database is locked" without waiting, tried again.

A journal mode change takes a lock that SQLite does not wait for (the busy timeout is
not consulted), so connections opening a new file at once get "database is locked" at
``PRAGMA journal_mode=WAL``: the embedded index's readers, and four commands run at once
on a new data directory, whose API database one to two of them failed to open. Used by
both (``cells.dialects``, ``indexer.engines.sqlite_connections``, whose opens are tried
again the same way).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
RETRY_EVERY = 0.005  # seconds between tries (a locked file, an open that met an I/O error)


def is_busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return isinstance(exc, sqlite3.OperationalError) and code in BUSY


def retrying(when: Callable[[BaseException], bool], timeout: float) -> Retrying:
    """Tries again, every ``RETRY_EVERY`` seconds for up to ``timeout``, what fails
    ``when`` says so; the last failure is raised as it was."""
    return Retrying(
        retry=retry_if_exception(when),
        stop=stop_after_delay(timeout),
        wait=wait_fixed(RETRY_EVERY),
        reraise=True,
    )


def apply_pragma(conn: sqlite3.Connection, pragma: str, timeout: float) -> None:
    """``conn.execute(pragma)``, a busy file tried again for up to ``timeout`` seconds."""
    for attempt in retrying(is_busy, timeout):
        with attempt:
            conn.execute(pragma)
