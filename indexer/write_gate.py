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

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

POLL = 0.1  # seconds between looks at the stop while a slot is waited for
DRAIN = 60.0  # seconds an interrupted run waits for its writes under way (SQLite's busy wait)
log = logging.getLogger(__name__)


class LinkedStop(threading.Event):
    """A run's stop that its owner's stop also sets, looked at on every ``is_set``: the
    indexer's periodic verify stops with the indexer (SIGTERM closed the engine under
    its cell threads) while a verify's own stop (a lost lock) leaves the indexer alone."""

    def __init__(self, outer: threading.Event) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        return super().is_set() or self._outer.is_set()


class WriteGate:
    def __init__(
        self,
        slots: int,
        stop: threading.Event,
        check: Callable[[], None] = lambda: None,
        abandon: Callable[[], None] = lambda: None,
    ) -> None:
        """``slots``: the engine's own bound (one on the embedded engine, whose writes are
        serialised on its write lock anyway). ``check`` runs before each write, in the
        slot: a lock no longer held raises there (``MaintenanceLock.check``). ``abandon``
        runs when ``drain`` gives up on a write still under way
        (``MaintenanceLock.abandon``: the lock is left to expire, not handed to the next
        run while that write may land)."""
        self.slots = max(1, slots)
        self._free = threading.Semaphore(self.slots)
        self._stop = stop
        self._check = check
        self._abandon = abandon

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

    def drain(self, timeout: float | None = None) -> bool:
        """Whether every write under way ended within ``timeout`` (seconds, ``DRAIN`` by
        default); call it once the stop is set, so that none starts after. The slots stay
        taken."""
        timeout = DRAIN if timeout is None else timeout
        deadline = time.monotonic() + timeout
        taken = 0
        try:
            while taken < self.slots and self._free.acquire(
                timeout=max(0.0, deadline - time.monotonic())
            ):
                taken += 1
        except BaseException:  # a second Ctrl-C: the writes may still be under way
            self._abandon()
            raise
        if taken < self.slots:
            log.warning("interrupted: a write still under way after %.0fs", timeout)
            self._abandon()
            return False
        return True
