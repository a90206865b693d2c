"""Repair writes of a verify's cell threads, no more at once than the engine takes.

A sync-probe: ``index verify --repair --workers 60`` on the embedded engine had sixty
threads queued for its write lock inside SQLite's busy wait, where no stop is seen
(``sqlite3``'s interrupt does not end that wait either). SIGTERM released the
maintenance lock over them, they went on writing, and the engine was closed under
them: SIGSEGV, exit 139, the lock's release itself refused as "database is locked".
Here the threads wait in Python, where a stop ends the wait, and the interrupted
caller waits for the writes under way (``drain``) before it releases anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

POLL = 0.1  # seconds between looks at the stop while a slot is waited for


class WriteGate:
    def __init__(
        self, slots: int, stop: threading.Event, check: Callable[[], None] = lambda: None
    ) -> None:
        """``slots``: the engine's own bound (one on the embedded engine, whose writes are
        serialised on its write lock anyway). ``check`` runs before each write, in the
        slot: a lock no longer held raises there (``MaintenanceLock.check``)."""
        self.slots = max(1, slots)
        self._free = threading.Semaphore(self.slots)
        self._stop = stop
        self._check = check

    @contextmanager
    def writing(self, stopped: Callable[[], BaseException]) -> Iterator[None]:
        """A slot for one write; ``stopped()`` is raised once the run is stopping."""
        while not self._free.acquire(timeout=POLL):
            if self._stop.is_set():
                raise stopped()
        try:
            if self._stop.is_set():
                raise stopped()
            try:
                self._check()
            except Exception:
                self._stop.set()  # the other cells' threads write no more either
                raise
            yield
        finally:
            self._free.release()

    def drain(self, timeout: float) -> bool:
        """Whether every write under way ended within ``timeout`` (seconds); call it once
        the stop is set, so that none starts after. The slots stay taken."""
        deadline = time.monotonic() + timeout
        taken = 0
        while taken < self.slots and self._free.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            taken += 1
        return taken == self.slots
