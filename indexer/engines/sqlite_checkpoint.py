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
every batch. If a steady writer never leaves that gap, the file would grow without end:
past ``truncate_at`` bytes this thread runs one TRUNCATE checkpoint (it waits for the
current writer, up to the busy timeout, and empties the file).
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
TRUNCATE_AT = 64 * 1024 * 1024  # WAL bytes that make this thread empty the file


class Checkpointer:
    def __init__(
        self,
        path: Path,
        *,
        timeout: float,
        interval: float = INTERVAL,
        truncate_at: int = TRUNCATE_AT,
    ) -> None:
        self.path = path
        self.wal = path.with_name(path.name + "-wal")
        self.timeout = timeout
        self.interval = interval
        self.truncate_at = truncate_at
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._due = threading.Event()
        self._pid = os.getpid()
        self.checkpoints = 0
        self.truncations = 0

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
        mode = "TRUNCATE" if size > self.truncate_at else "PASSIVE"
        try:
            conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        except sqlite3.Error as exc:
            # Busy or locked: the next round tries again, and the writer's fallback
            # threshold still bounds the WAL.
            log.debug("checkpoint of %s skipped: %s", self.path, exc)
            return
        self.checkpoints += 1
        self.truncations += mode == "TRUNCATE"

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._due.set()
        if thread is not None and thread.is_alive() and self._pid == os.getpid():
            thread.join(self.timeout + 1.0)
