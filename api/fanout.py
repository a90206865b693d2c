"""The fan-out path: every cell queried concurrently, answers merge-sorted.

Deadlines: each cell engine carries a statement timeout (``cells.database``: PostgreSQL
``statement_timeout``, MariaDB ``max_statement_time`` plus socket timeouts, SQLite a
progress handler), so a slow cell's query is cancelled by its server or driver; the
wait for the first batches is also bounded (``wait_bound``) so a cell stuck before its
statement starts (connecting) cannot hold the request either. A cell that fails or is
late is skipped and reported; nothing here raises for one cell.

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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from api.celldocs import search_cell
from api.order import order_key, sort_values
from cells.database import Engines, connect
from cells.mappings import CellMapping
from indexer.query.sqlite_regexp import install_on_engine
from indexer.query.tree import SearchRequest

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
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


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
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="cellsight-cell")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.engines.dispose()

    def engine(self, cell: CellMapping) -> sa.Engine:
        engine = self.engines.get(cell.database_url)
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
        self, cells: list[CellMapping], fn: Callable[[CellMapping, sa.Connection], T]
    ) -> CellResults[T]:
        """``fn(cell, connection)`` in every cell at once, under the cell deadline."""
        out: CellResults[T] = CellResults()
        futures: dict[Future[T], CellMapping] = {
            self._pool.submit(self._in_cell, cell, fn): cell for cell in cells
        }
        done, late = wait(futures, timeout=self.wait_bound)
        for future in late:
            cell = futures[future]
            future.cancel()
            out.skipped.append(SkippedCell(cell.uuid, cell.name, "timeout"))
        for future in done:
            cell = futures[future]
            exc = future.exception()
            if exc is None:
                out.results[cell.uuid] = future.result()
            else:
                out.skipped.append(self._failed(cell, exc))
        if out.skipped:
            log.warning(
                "skipped cells: %s",
                ", ".join(
                    f"{s.name} ({s.reason}{': ' + s.detail if s.detail else ''})"
                    for s in out.skipped
                ),
            )
        out.skipped.sort(key=lambda s: s.name)
        return out

    def _in_cell(self, cell: CellMapping, fn: Callable[[CellMapping, sa.Connection], T]) -> T:
        with connect(self.engine(cell)) as conn:
            return fn(cell, conn)

    @staticmethod
    def _failed(cell: CellMapping, exc: BaseException) -> SkippedCell:
        text = _describe(exc).lower()
        timed_out = any(
            w in text
            for w in (
                "timeout",
                "timed out",
                "interrupted",
                "canceling statement",
                "max_statement_time",
                "lost connection",
            )
        )
        return SkippedCell(
            cell.uuid, cell.name, "timeout" if timed_out else "error", _describe(exc)
        )

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
            except Exception as exc:
                skipped.append(self._failed(cell, exc))
                log.warning("skipped cell %s mid-listing: %s", cell.name, _describe(exc))
                return
            rows_read[cell.uuid] = rows_read.get(cell.uuid, 0) + len(docs)
