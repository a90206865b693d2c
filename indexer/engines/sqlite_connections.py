"""Connections and transactions of the embedded index: one connection per thread.

The API reads from a thread pool; a connection per thread (``threading.local``) lets
those reads run in parallel under WAL, and never shares a connection's transaction
state between threads. ``transaction`` maps SQLite's errors onto the engine's.

A connection keeps the file it opened, even once that file is removed or replaced
(``rm index.db*`` to start afresh): everything written after would go to a file nobody
can open again. So each transaction first checks that the path still names the file
its thread's connection opened (one ``stat``); when it does not, the thread closes its
connection and opens the path anew, empty until the indexer makes its indexes again
(``IndexMissing``) and a sync refills it, as after a restart.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from cellsight.indexer.engines.base import EngineError, EngineUnavailable
from cellsight.indexer.engines.sqlite_catalog import Catalog
from cellsight.indexer.engines.sqlite_checkpoint import Checkpointer
from cellsight.sqlite_pragmas import apply_pragma, retrying
from cellsight.sqlite_storage import explained

log = logging.getLogger(__name__)
FileIdentity = tuple[int, int] | None  # (st_dev, st_ino); None: no file at the path

# SQLite's primary result codes that mean "try again later" rather than "bug".
_TRANSIENT = {
    5: "busy",
    6: "locked",
    7: "out of memory",
    10: "I/O error",
    13: "disk full",
    14: "cannot open",
    15: "lock protocol",
}
SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

# The sqlite3 module binds an exact int, float, str or bytearray directly, but runs its
# adaptation protocol for anything else, None and bool included: a registry miss, then a
# ``__adapt__`` lookup on its protocol type that fails with a formatted AttributeError,
# about 2,000 instructions a value (callgrind); a row of the index carries a dozen. An
# adapter found in the registry is called at once instead. Both bind what they bound
# before (NULL; 0 or 1), so registering them for the whole process changes no value, in
# the cells' SQLite either. ``{}.get`` answers None for any key, without a Python frame.
# (``sqlite3.adapt`` now answers None and 1 for them where it raised; nothing calls it.)
sqlite3.register_adapter(type(None), cast("Callable[[None], None]", {}.get))
sqlite3.register_adapter(bool, int)


def _io_error(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return isinstance(exc, sqlite3.OperationalError) and code == sqlite3.SQLITE_IOERR


def translate(exc: sqlite3.Error, path: object) -> EngineError:
    """By SQLite's result code, naming the file (a probe of full disks: "index database
    disk full" said which database, not where). A table dropped under a reader is not
    classified here: the catalog (read in the same transaction, or asked again after the
    error) says whether an index exists, and raises ``IndexMissing``."""
    code = getattr(exc, "sqlite_errorcode", None)
    state = explained(exc, path if isinstance(path, Path) else None)
    said = f"{exc} ({state})" if state else str(exc)
    if code is not None and code & 0xFF in _TRANSIENT:
        return EngineUnavailable(f"index database {path} {_TRANSIENT[code & 0xFF]}: {said}")
    return EngineError(f"index database {path}: {said}")


class Connections:
    def __init__(
        self, path: Path, prefix: str, *, timeout: float, synchronous: str, cache_mb: int
    ) -> None:
        self.path = path
        self.prefix = prefix
        self.timeout = timeout
        self.checkpointer = Checkpointer(path, timeout=timeout)
        self._pragmas: tuple[str, ...] = (
            # 8 KiB pages hold five ~1.5 KB documents where 4 KiB pages hold two, wasting
            # a quarter; measured ~30% faster loads. Only takes effect on a new file.
            "PRAGMA page_size=8192",
            "PRAGMA journal_mode=WAL",
            f"PRAGMA synchronous={synchronous}",
            f"PRAGMA cache_size=-{cache_mb * 1024}",
            "PRAGMA temp_store=MEMORY",
            self.checkpointer.size_limit_pragma(),
        )
        self._local = threading.local()
        self._lock = threading.Lock()
        # Every open connection, the file it holds and the thread that owns it.
        self._all: list[tuple[sqlite3.Connection, FileIdentity, threading.Thread]] = []
        self._checkpoints_for: FileIdentity = None  # the file the checkpointer serves
        self._warned: set[FileIdentity] = set()

    def get(self) -> sqlite3.Connection:
        # The pid check: a forked child must not reuse its parent's connection.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            if self._local.identity == self.identity_now():
                return conn
            self._leave(conn, self._local.identity)
        try:
            # Files removed while another connection makes them again (``rm index.db*``
            # under a running API) can fail opens with an I/O error until the files are
            # as SQLite left them: measured up to 42 opens in a row (about 0.2 s) with 12
            # readers on a loaded 2-core machine, where 3 tries gave up once in ~400
            # removals. So opens are tried for as long as a lock is waited for.
            for attempt in retrying(_io_error, self.timeout):
                with attempt:
                    fresh, identity = self._open()
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, sqlite3.Error):
                raise translate(exc, self.path) from exc
            raise EngineUnavailable(f"index database {self.path}: {exc}") from exc
        self._local.conn, self._local.pid, self._local.writes = fresh, os.getpid(), False
        self._local.identity = identity
        with self._lock:
            # The connections of threads that have ended go with them: the API's pool
            # retires idle threads and starts new ones for the next burst, and each kept
            # its connection and cache until the engine closed (an adversarial probe:
            # 15 connections and ~200 MB more after every burst, never given back).
            ended = [entry for entry in self._all if not entry[2].is_alive()]
            self._all = [entry for entry in self._all if entry[2].is_alive()]
            self._all.append((fresh, identity, threading.current_thread()))
        for old, _, _ in ended:
            old.close()
        return fresh

    def _open(self) -> tuple[sqlite3.Connection, FileIdentity]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=self.timeout,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE to write
            check_same_thread=False,  # only so close() can close every thread's one
            cached_statements=512,
        )
        try:
            for pragma in self._pragmas:
                self._apply(conn, pragma)
            identity = self.identity_now()  # the file exists once the WAL mode is set
            # Every new connection: the file may be new to this process, whichever thread
            # comes to it first.
            Catalog(conn, self.prefix).ensure()
        except BaseException:
            conn.close()
            raise
        return conn, identity

    def identity_now(self) -> FileIdentity:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _leave(self, conn: sqlite3.Connection, stale: FileIdentity) -> None:
        """The path no longer names the file this thread's connection holds: close it, and
        the connections to that file of threads that have ended. A live thread's own is
        closed by that thread at its next ``get``: never under its feet (sqlite3 does not
        survive a connection closed while another thread uses it)."""
        with self._lock:
            if stale not in self._warned:
                self._warned.add(stale)
                log.warning(
                    "index database %s was removed or replaced while open: opening it "
                    "anew (what the old file held is gone; `cellsight index sync` refills it)",
                    self.path,
                )
            done = [
                entry
                for entry in self._all
                if entry[0] is conn or (entry[1] == stale and not entry[2].is_alive())
            ]
            self._all = [entry for entry in self._all if entry not in done]
        for old, _, _ in done:
            old.close()
        self._local.conn = None

    def _apply(self, conn: sqlite3.Connection, pragma: str) -> None:
        apply_pragma(conn, pragma, self.timeout)

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Catalog]:
        """One transaction: IMMEDIATE takes the write lock up front, so versions read in
        it stay true; a read transaction pins one snapshot (alias and table agree)."""
        conn = self.get()
        if write and not self._local.writes:
            # This connection writes: checkpoints move to their own thread (see
            # ``sqlite_checkpoint``). Readers never checkpoint, so they are left alone.
            conn.execute(self.checkpointer.writer_pragma())
            with self._lock:
                moved = self._checkpoints_for != self._local.identity
                self._checkpoints_for = self._local.identity
            if moved:  # its thread holds a file that is gone: a new one opens this one
                self.checkpointer.close()
            self.checkpointer.ensure_running()
            self._local.writes = True
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield Catalog(conn, self.prefix)
            except BaseException:
                _rollback(conn)
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise translate(exc, self.path) from exc
        if write:
            self.checkpointer.committed()

    def close(self) -> None:
        """Close every thread's connection; call it when no thread is using the engine."""
        self.checkpointer.close()
        with self._lock:
            connections, self._all = self._all, []
        for conn, _, _ in connections:
            conn.close()
        self._local = threading.local()


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.ProgrammingError:
        pass  # closed by ``Connections.close`` meanwhile: nothing left to roll back
