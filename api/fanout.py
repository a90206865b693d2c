"""The fan-out path: every cell queried concurrently, answers merge-sorted.

Deadlines: each cell engine carries a statement timeout (``cellsight.cells.database``: PostgreSQL
``statement_timeout``, MariaDB ``max_statement_time`` plus socket timeouts, SQLite a
progress handler), so a slow cell's query is cancelled by its server or driver; the
wait for the first batches is also bounded (``wait_bound``) so a cell stuck before its
statement starts (connecting) cannot hold the request either. A cell that fails or is
late is skipped and reported; nothing here raises for one cell.

Deadlines start when a cell's query starts, not when it is queued. In front of the
pool, admission control reserves one worker per cell of a request (all of them at
once, so requests cannot starve each other half-admitted); when the pool is saturated
the request waits up to ``admission_wait`` and then gets ``Saturated`` (a 503 with
``Retry-After``), never a false "cell down". Timeout versus error is decided by the
driver's exception type (``cellsight.api.driver_errors``). An exception that is not the
database's is our bug: it propagates (a logged 500), it is not reported as a down cell.

Batches: the first query of each cell asks for ``batch_size(limit, cells)`` rows
(``limit / cells * 1.1``, at least ``min_batch``, at most ``limit``). ``heapq.merge``
pulls rows in the total order; a cell whose batch is used up and was full gets its next
batch (keyset after its last row) only when the merge reaches it, so cells whose rows
are not needed are never asked again.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from cellsight.api.cell_documents import search_cell
from cellsight.api.driver_errors import CELL_FAILURES, classify, is_cell_failure
from cellsight.api.errors import ServiceUnavailable
from cellsight.api.merge_order import order_key, sort_values
from cellsight.api.metrics import ApiMetrics
from cellsight.cells.database import Engines, connect
from cellsight.cells.mappings import CellMapping, cell_engine
from cellsight.query.sqlite_regexp import install_on_engine
from cellsight.query.tree import SearchRequest

log = logging.getLogger(__name__)

T = TypeVar("T")
Doc = dict[str, Any]


@dataclass(frozen=True)
class SkippedCell:
    uuid: str
    name: str
    reason: str  # "timeout" or "error"
    detail: str = ""


@dataclass
class CellResults(Generic[T]):
    results: dict[str, T] = field(default_factory=dict)
    skipped: list[SkippedCell] = field(default_factory=list)


@dataclass
class FanOutResult:
    documents: list[Doc]
    skipped: list[SkippedCell]
    rows_read: dict[str, int]  # cell uuid → rows fetched, every batch counted


def _describe(exc: BaseException) -> str:
    """For the log only (driver text never reaches a client)."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


class Saturated(ServiceUnavailable):
    """No room in the fan-out pool (or for an index search) within the admission wait."""

    def __init__(self, retry_after: int, busy_with: str = "other listings from the cells") -> None:
        super().__init__(
            f"The API is busy answering {busy_with}; retry shortly.",
            headers={"Retry-After": str(retry_after)},
        )


class Admission:
    """Counts free workers; a request takes ``n`` at once or waits (bounded)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = slots
        self._cond = threading.Condition()

    def acquire(self, n: int, timeout: float) -> bool:
        n = min(n, self.slots)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._free < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._free -= n
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self._free += min(n, self.slots)
            self._cond.notify_all()


class FanOut:
    def __init__(
        self,
        *,
        cell_timeout: float,
        connect_timeout: float = 5.0,
        max_workers: int = 32,
        min_batch: int = 100,
        batch_factor: float = 1.1,
        engines: Engines | None = None,
        admission_wait: float = 2.0,
        metrics: ApiMetrics | None = None,
    ) -> None:
        self.cell_timeout = cell_timeout
        # Connecting is part of the cell's deadline.
        self.engines = engines or Engines(
            connect_timeout=min(connect_timeout, cell_timeout), statement_timeout=cell_timeout
        )
        self.min_batch = min_batch
        self.batch_factor = batch_factor
        # Grace past the statement timeout for the server's cancel to come back.
        self.wait_bound = cell_timeout + 0.5
        self.max_workers = max_workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.admission = Admission(max_workers)
        self.admission_wait = admission_wait
        self.metrics = metrics or ApiMetrics()

    def close(self) -> None:
        """Stop the pool and drop connections; a later fan-out starts them again (an
        app's lifespan may run more than once, e.g. under test clients)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self.engines.dispose()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.max_workers, thread_name_prefix="cellsight-cell"
                )
            return self._pool

    def engine(self, cell: CellMapping) -> sa.Engine:
        engine = cell_engine(self.engines, cell)
        # SQLite cells need the REGEXP function, bounded by the same deadline.
        install_on_engine(engine, timeout=self.cell_timeout)
        return engine

    def batch_size(self, limit: int, cells: int) -> int:
        if cells <= 1:
            return limit
        wanted = math.ceil(limit / cells * self.batch_factor)
        return max(1, min(limit, max(self.min_batch, wanted)))

    # ------------------------------------------------------------ generic fan-out

    def map_cells(
        self,
        cells: list[CellMapping],
        fn: Callable[[CellMapping, sa.Connection], T],
        *,
        count_skipped: bool = True,
    ) -> CellResults[T]:
        """``fn(cell, connection)`` in every cell at once, each under its deadline
        (counted from when its query starts); ``Saturated`` if the pool has no room.
        Skipped cells are counted and logged unless ``count_skipped`` is false (a
        readiness check, which reports them itself: every probe of a load balancer
        counted each down cell as skipped by a listing)."""
        out: CellResults[T] = CellResults()
        if not cells:
            return out
        if not self.admission.acquire(len(cells), self.admission_wait):
            self.metrics.admission.labels("refused").inc()
            raise Saturated(retry_after=max(1, math.ceil(self.cell_timeout)))
        self.metrics.admission.labels("admitted").inc()
        try:
            self._run(cells, fn, out)
        finally:
            self.admission.release(len(cells))
        out.skipped.sort(key=lambda s: s.name)
        if not count_skipped:
            return out
        for s in out.skipped:
            self.metrics.cells_skipped.labels(s.name, s.reason).inc()
        if out.skipped:
            log.warning(
                "skipped cells: %s",
                ", ".join(
                    f"{s.name} ({s.reason}{': ' + s.detail if s.detail else ''})"
                    for s in out.skipped
                ),
            )
        return out

    def _run(
        self,
        cells: list[CellMapping],
        fn: Callable[[CellMapping, sa.Connection], T],
        out: CellResults[T],
    ) -> None:
        started: dict[str, float] = {}
        pool = self._executor()
        futures: dict[Future[T], CellMapping] = {
            pool.submit(self._in_cell, cell, fn, started): cell for cell in cells
        }
        pending = set(futures)
        while pending:
            now = time.monotonic()
            late = {
                f
                for f in pending
                if futures[f].uuid in started and now - started[futures[f].uuid] > self.wait_bound
            }
            for future in late:
                cell = futures[future]
                future.cancel()
                out.skipped.append(SkippedCell(cell.uuid, cell.name, "timeout"))
            pending -= late
            if not pending:
                break
            ends = [
                started[futures[f].uuid] + self.wait_bound
                for f in pending
                if futures[f].uuid in started
            ]
            # A queued cell has no deadline yet: look again soon.
            timeout = min(ends) - now if len(ends) == len(pending) else 0.05
            done, pending = wait(pending, timeout=max(timeout, 0.001), return_when=FIRST_COMPLETED)
            for future in done:
                cell = futures[future]
                exc = future.exception()
                if exc is None:
                    out.results[cell.uuid] = future.result()
                elif is_cell_failure(exc):
                    out.skipped.append(self._failed(cell, exc))
                else:
                    raise exc

    def _in_cell(
        self,
        cell: CellMapping,
        fn: Callable[[CellMapping, sa.Connection], T],
        started: dict[str, float],
    ) -> T:
        begun = started[cell.uuid] = time.monotonic()
        try:
            with connect(self.engine(cell)) as conn:
                return fn(cell, conn)
        finally:
            self.metrics.cell_queries.observe(time.monotonic() - begun)

    @staticmethod
    def _failed(cell: CellMapping, exc: BaseException) -> SkippedCell:
        return SkippedCell(cell.uuid, cell.name, classify(exc), _describe(exc))

    # ---------------------------------------------------------------- listing

    def fetch(self, cell: CellMapping, conn: sa.Connection, request: SearchRequest) -> list[Doc]:
        """One batch of a cell's instances as documents, in the request's order."""
        return search_cell(conn, request, cell.uuid)

    def search(self, request: SearchRequest, cells: list[CellMapping]) -> FanOutResult:
        """The first ``request.limit`` instances of all ``cells`` in the total order."""
        if request.limit < 1 or not cells:
            return FanOutResult([], [], {})
        batch = self.batch_size(request.limit, len(cells))
        first = replace(request, limit=batch)
        started = self.map_cells(cells, lambda cell, conn: self.fetch(cell, conn, first))
        skipped = list(started.skipped)
        rows_read = {uuid: len(docs) for uuid, docs in started.results.items()}
        by_uuid = {c.uuid: c for c in cells}
        streams = [
            self._stream(by_uuid[uuid], docs, first, skipped, rows_read)
            for uuid, docs in started.results.items()
        ]
        merged = heapq.merge(*streams, key=order_key(request.order))
        documents = list(islice(merged, request.limit))
        return FanOutResult(documents, skipped, rows_read)

    def _stream(
        self,
        cell: CellMapping,
        docs: list[Doc],
        request: SearchRequest,
        skipped: list[SkippedCell],
        rows_read: dict[str, int],
    ) -> Iterator[Doc]:
        """A cell's rows in order; the next batch is fetched when the merge gets there."""
        while True:
            yield from docs
            if len(docs) < request.limit:
                return  # the cell has no more rows
            after = replace(request, after=sort_values(docs[-1], request.order))
            try:
                with connect(self.engine(cell)) as conn:
                    docs = self.fetch(cell, conn, after)
            except CELL_FAILURES as exc:
                skipped.append(self._failed(cell, exc))
                self.metrics.cells_skipped.labels(cell.name, skipped[-1].reason).inc()
                log.warning("skipped cell %s mid-listing: %s", cell.name, _describe(exc))
                return
            rows_read[cell.uuid] = rows_read.get(cell.uuid, 0) + len(docs)
