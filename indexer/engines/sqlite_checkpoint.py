"""WAL checkpoints of the embedded index on a thread of their own, off the write path.

By default SQLite checkpoints in the connection that commits, once the WAL passes 1,000
pages: that commit then copies the WAL back into the database file and syncs it, and the
indexer's next batch waits. Here a thread with its own connection checkpoints right
after each commit (and every ``interval`` seconds at the latest), PASSIVE, so it never
blocks a writer or a reader, while the writer goes on preparing its next batch's rows
outside any transaction. The writer's own automatic checkpoint is pushed back to a large
fallback threshold, so it only happens if this thread falls behind.
``scripts/bench_embedded.py`` measures the same rows both ways in one run
(``checkpoint_thread_gain``).

The WAL restarts from its beginning only when a write transaction begins after a
checkpoint copied all of it; checkpointing right after the commit gives that a chance
every batch, but a writer that begins its next transaction before the copy ends (a busy
indexer always does) keeps appending. Past ``restart_at`` bytes this thread runs one
RESTART checkpoint: it waits for the current writer (up to the busy timeout), copies
everything, and makes the next writer start over at the beginning of the file. The file
is not emptied (``journal_size_limit``, set on every connection, trims it to
``restart_at`` when the log restarts): the next batches overwrite its blocks, which the
kernel still caches, where a file emptied by TRUNCATE regrew into new blocks that the
file system allocated and zeroed on every write. Measured on 100,000 new instances in
batches of 1,000 (three interleaved runs each): 37 µs of system CPU per document instead
of 41-49.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

INTERVAL = 0.5  # seconds between checkpoints when no commit asks for one sooner
WRITER_FALLBACK_PAGES = 16384  # the writer checkpoints itself only past this (128 MiB)
RESTART_AT = 64 * 1024 * 1024  # WAL bytes that make this thread restart the log


class Checkpointer:
    def __init__(
        self,
        path: Path,
        *,
        timeout: float,
        interval: float = INTERVAL,
        restart_at: int = RESTART_AT,
    ) -> None:
        self.path = path
        self.wal = path.with_name(path.name + "-wal")
        self.timeout = timeout
        self.interval = interval
        self.restart_at = restart_at
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._due = threading.Event()
        self._pid = os.getpid()
        self.checkpoints = 0
        self.restarts = 0

    def size_limit_pragma(self) -> str:
        """For every connection: the WAL file is trimmed to ``restart_at`` bytes when the
        log restarts (whichever connection restarts it), not emptied and not left larger."""
        return f"PRAGMA journal_size_limit={self.restart_at}"

    def writer_pragma(self) -> str:
        """For the connection that writes: its own checkpoints only as a fallback."""
        return f"PRAGMA wal_autocheckpoint={WRITER_FALLBACK_PAGES}"

    def ensure_running(self) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid, self._thread = os.getpid(), None
                self._stop, self._due = threading.Event(), threading.Event()
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"checkpoint:{self.path.name}", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        except sqlite3.Error as exc:
            log.warning("checkpoints of %s stay with the writer: %s", self.path, exc)
            return
        try:
            while not self._stop.is_set():
                self._due.wait(self.interval)
                self._due.clear()
                if not self._stop.is_set():
                    self.checkpoint(conn)
        finally:
            conn.close()

    def committed(self) -> None:
        """A write transaction committed: checkpoint now, while the writer prepares."""
        self._due.set()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            size = self.wal.stat().st_size
        except OSError:
            return  # no WAL yet (or the index was removed): nothing to copy
        mode = "RESTART" if size > self.restart_at else "PASSIVE"
        try:
            conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        except sqlite3.Error as exc:
            # Busy or locked: the next round tries again, and the writer's fallback
            # threshold still bounds the WAL.
            log.debug("checkpoint of %s skipped: %s", self.path, exc)
            return
        self.checkpoints += 1
        self.restarts += mode == "RESTART"

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._due.set()
        if thread is not None and thread.is_alive() and self._pid == os.getpid():
            thread.join(self.timeout + 1.0)
