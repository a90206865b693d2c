"""Python's cycle collector run between batches, not every 700 allocations.

The collector runs a young-generation pass whenever allocations outnumber deallocations
by 700, and older passes every tenth of those. Planning a batch of 1,000 notifications
allocates tens of thousands of dicts and lists that all stay alive until the batch is
written, so passes run hundreds of times per batch and scan the same live objects again
and again, and full passes scan every message in the prefetch window too. Yet the
indexer's data is acyclic and freed by reference counting; only a rare cycle (an
exception and its traceback, from a poison message) needs the collector.

So in a process dedicated to the indexer (``cellsight indexer``'s workers, their writer
processes, bulk sync's workers; not the demo, whose indexer shares a process with the
API) automatic collection is off while the consumer runs, and the collector runs after
each batch is settled, when most of its objects have been freed: the young generation
after every batch, the middle one every tenth batch, and everything once ``full_every``
seconds have passed since the last full pass. Between batches, when the bus wait times
out, the bus is reconnecting or a writer retries through an engine outage, the same full
pass runs if it is due: the process's other threads (the outbox relay, the periodic
verify, the metrics server) keep allocating while no batch settles. Measured on the
writer-process pipeline (RabbitMQ → embedded, 20,000 notifications, four interleaved
runs): consumer CPU 224 → 187 µs per notification (median), throughput up 2-16% in
each run.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from types import TracebackType

FULL_EVERY = 60.0  # seconds between full passes
MIDDLE_EVERY = 10  # batches between passes over the two younger generations


class BatchCollector:
    """``with BatchCollector() as collector:`` … ``collector.batch_done()`` after each
    batch. Collection is process-wide: leaving re-enables it if it was on on entry
    (overlapping users in one process, as in tests, leave it on when the last one that
    found it on leaves)."""

    def __init__(
        self, full_every: float = FULL_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.full_every = full_every
        self._clock = clock
        self._batches = 0
        self._last_full = 0.0
        self._was_enabled = False
        self._lock = threading.Lock()

    def __enter__(self) -> BatchCollector:
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._last_full = self._clock()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._was_enabled:
            gc.enable()

    def _full_due(self) -> bool:
        """Whether a full pass is due, and if so the clock of the next one starts now
        (under a lock: writer threads ask from their retries, see ``idle``)."""
        with self._lock:
            now = self._clock()
            if now - self._last_full < self.full_every:
                return False
            self._last_full = now
            return True

    def idle(self) -> int | None:
        """No batch is settling: a full pass if none ran for ``full_every`` seconds (safe
        from several threads: writer threads call it from their retries)."""
        if not self._full_due():
            return None
        gc.collect()
        return 2

    def batch_done(self) -> int:
        """Collect what this batch left; returns the generation collected."""
        self._batches += 1
        if self._full_due():
            generation = 2
        elif self._batches % MIDDLE_EVERY == 0:
            generation = 1
        else:
            generation = 0
        gc.collect(generation)
        return generation
