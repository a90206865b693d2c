"""Several bulk requests in flight, answered in the order they were sent.

The consumer overlaps receiving and decoding with writing: it submits a batch and goes
on; ``InFlight`` hands results back oldest first, so acknowledgements stay in delivery
order however the requests finish. The bound is the engine's
(``capabilities.max_in_flight``: 5 on Elasticsearch/OpenSearch, as Kafka Connect's
``max.in.flight.requests``; 1 on the embedded engine, whose ``submit_bulk`` writes at
once). Versions are external, so two batches in flight with the same document still
leave the higher version stored, whichever request lands last.

    inflight = InFlight(engine)
    inflight.submit(ops, tag)            # blocks only while the engine is at its bound
    for tag, results in inflight.ready():   # the leading finished batches, in order
        ack(tag, results)
    for tag, results in inflight.drain():   # at shutdown: wait for every one, in order
        ack(tag, results)

A batch whose request failed (``EngineUnavailable``...) raises from ``ready``/``drain``
when it is the oldest; it stays the oldest (``pop_failed`` takes it off), so nothing
after it is acknowledged before the caller has dealt with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from cellsight.indexer.engines.base import DocumentStore, WriteOp, WriteResult

T = TypeVar("T")


class InFlight(Generic[T]):
    def __init__(self, engine: DocumentStore) -> None:
        self.engine = engine
        self._pending: deque[tuple[T, Sequence[WriteOp], Future[list[WriteResult]]]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, ops: Sequence[WriteOp], tag: T) -> None:
        self._pending.append((tag, ops, self.engine.submit_bulk(ops)))

    def ready(self) -> Iterator[tuple[T, list[WriteResult]]]:
        """The finished batches at the head of the queue, oldest first; stops at the
        first one still running."""
        while self._pending and self._pending[0][2].done():
            yield self._take()

    def drain(self, timeout: float | None = None) -> Iterator[tuple[T, list[WriteResult]]]:
        """Every batch, oldest first, waiting for each (at most ``timeout`` seconds for
        one: ``TimeoutError`` then, the batch kept)."""
        while self._pending:
            self._pending[0][2].result(timeout)
            yield self._take()

    def pop_failed(self) -> tuple[T, Sequence[WriteOp], BaseException]:
        """The oldest batch, whose request raised, with its ops (to retry or requeue)."""
        tag, ops, future = self._pending[0]
        exc = future.exception(0)
        if exc is None:
            raise ValueError("the oldest batch did not fail")
        self._pending.popleft()
        return tag, ops, exc

    def _take(self) -> tuple[T, list[WriteResult]]:
        tag, _ops, future = self._pending[0]
        results = future.result(0)  # raises the request's error; the batch stays
        self._pending.popleft()
        return tag, results
