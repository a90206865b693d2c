"""Bulk sync's pipeline: workers read a cell's rows, build documents and write them.

Each worker takes cells one at a time from a task queue, pages through their rows
(``sources``), builds the batch's documents and writes them itself, then reports the
batch's figures to the coordinator (the caller's thread), which shows progress, checks
the lock and stops everything on the first error. Memory stays flat: a worker holds one
page of rows and its documents at a time.

On the embedded engine the workers are processes (for large loads): building documents
and preparing the engine's rows is CPU-bound Python that threads would run one at a
time under the GIL. SQLite has one writer, so the workers pass a write token (a lock)
around: while one writes its batch, the others read and build theirs, and the writes
follow each other without waiting out SQLite's busy-retry sleeps. A worker process
checks between batches that its parent still lives, so a killed sync leaves none
behind. HTTP engines get threads (the cluster does the work) writing concurrently.

A write that failed transiently (``EngineUnavailable``: a timeout, a refused connection,
429, 5xx, a busy embedded index; or items answered ``RETRY``) is sent again after a
backoff, a bounded number of times (``retries``), before it fails the sync: one
timeout in a long load would otherwise throw the whole load away.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue as queuelib
import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from cellsight.cells.database import Engines, connect
from cellsight.cells.dialects import Timeouts
from cellsight.indexer.cell_streams import CellDocs, CellRef, Scope
from cellsight.indexer.collector import BatchCollector
from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteResult, WriteStatus
from cellsight.indexer.retries import write_retrying
from cellsight.indexer.sync_request import RETRY_BACKOFF, peak_rss_mb
from cellsight.indexer.verify_report import brief

# Below this many rows, starting worker processes costs more than it saves.
PROCESS_MIN_ROWS = 50_000
EXITED_GRACE = 5.0  # seconds to wait for what workers that all exited sent last
Message = tuple[Any, ...]


class LoadError(Exception):
    """A cell could not be read, or documents could not be written; says which."""


@dataclass
class CellTally:
    uuid: str
    name: str
    expected: int = 0  # rows counted before the load: the progress total
    read: int = 0
    written: int = 0  # created, or replaced an older version
    stale: int = 0  # the index already held this version or a newer one (a live write)
    rejected: int = 0
    fallbacks: int = 0
    reasons: list[str] = field(default_factory=list)  # the first rejections, for the report
    rows_now: int | None = None  # the cell's rows in scope, counted after the load
    documents: int | None = None  # the index's documents of the cell, counted then too

    def as_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "name": self.name,
            "rows": self.read,
            "written": self.written,
            "stale": self.stale,
            "rejected": self.rejected,
            "reference_path": self.fallbacks,
            "rejections": self.reasons,
            "rows_now": self.rows_now,
            "documents": self.documents,
        }


@dataclass(frozen=True)
class LoadJob:
    """What a worker needs; plain values, so it can go to a process."""

    scope: Scope
    event_type: str
    batch_size: int
    timeouts: Timeouts  # the cells' engines'
    index: str | None  # bulk_index into this index; None: bulk through the write alias
    # a picklable engine factory for worker processes (``SearchEngine.reopener``)
    reopen: Callable[[], SearchEngine] | None = None
    backoff: float = RETRY_BACKOFF  # seconds before the first retry (``retrying``)


def _write(
    engine: SearchEngine,
    job: LoadJob,
    ops: list[WriteOp],
    token: Any,
    what: str,
    stopped: Callable[[], bool],
) -> list[tuple[WriteOp, WriteResult]]:
    """Each op with its final result, transient failures retried (``write_retrying``);
    items still asked to retry after the last round are counted rejected."""
    return write_retrying(
        lambda pending: _send(engine, job, pending, token),
        ops,
        what,
        backoff=job.backoff,
        stopped=stopped,
    )


def _send(
    engine: SearchEngine, job: LoadJob, ops: list[WriteOp], token: Any
) -> Sequence[WriteResult]:
    """One bulk write; ``token`` is held only while writing, never while backing off."""
    if job.index is None:
        with token:
            return engine.bulk(ops)
    return list(engine.bulk_index(job.index, iter(ops), chunk_size=len(ops), lock=token))


def _work(
    job: LoadJob,
    engine: SearchEngine,
    engines: Engines,
    tasks: Any,
    out: Any,
    stopped: Callable[[], bool],
    token: Any,
    own_process: bool = False,
    batch_done: Callable[[], object] = lambda: None,
) -> None:
    """A worker: cells from ``tasks`` until it is empty; one message per batch."""
    cell: CellRef | None = None
    try:
        while not stopped():
            try:
                cell = tasks.get_nowait()
            except queuelib.Empty:
                break
            docs = CellDocs(job.scope, cell.uuid, job.event_type)
            what = f"cell {cell.name}"
            with connect(engines.get(cell.url)) as conn:
                for ops in docs.iter_batches(conn, job.batch_size):
                    counts = {"written": 0, "stale": 0, "rejected": 0}
                    reasons = []
                    for op, result in _write(engine, job, ops, token, what, stopped):
                        if result.status is WriteStatus.OK:
                            counts["written"] += 1
                        elif result.status is WriteStatus.STALE:
                            counts["stale"] += 1
                        else:
                            counts["rejected"] += 1
                            reasons.append(f"{op.id}: {result.reason}")
                    out.put(("batch", cell.uuid, len(ops), counts, reasons[:5]))
                    del ops
                    batch_done()
                    if stopped():
                        return
            out.put(("done", cell.uuid, docs.fallbacks))
            if own_process:
                engines.dispose()  # memory stays flat however many cells there are
    except BaseException as exc:  # reported to the coordinator, which fails the sync
        where = f"cell {cell.name}: " if cell is not None else ""
        # One line: SQLAlchemy's text of a database error adds the statement and its
        # parameters, which an operator's terminal need not see.
        out.put(("error", None, f"{where}{brief(exc)}"))
    finally:
        out.put(("exit", None, peak_rss_mb() if own_process else 0.0))


def _process_worker(job: LoadJob, tasks: Any, out: Any, stop: Any, token: Any, parent: int) -> None:
    # Ctrl-C reaches the whole process group: the parent cleans up and ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()  # what the imports made: collections then only walk the batch
    assert job.reopen is not None
    engine = job.reopen()
    engines = Engines.of(job.timeouts)
    try:

        def stopped() -> bool:
            return bool(stop.is_set()) or os.getppid() != parent

        # The cycle collector between batches, not amid one (``collector`` says why).
        with BatchCollector() as collector:
            _work(job, engine, engines, tasks, out, stopped, token, True, collector.batch_done)
    finally:
        engine.close()
        engines.dispose()


class Loader:
    """Loads ``cells`` with ``workers`` workers; ``check`` runs between messages (the
    lock), ``on_written`` gets progress."""

    def __init__(
        self,
        cells: list[CellRef],
        job: LoadJob,
        *,
        engine: SearchEngine,
        engines: Engines,
        workers: int,
        processes: bool,
        tallies: dict[str, CellTally],
        on_written: Callable[[str, int], None] = lambda cell, n: None,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        self.cells = cells
        self.job = job
        self.engine = engine
        self.engines = engines
        self.workers = max(1, min(workers, len(cells)))
        self.processes = processes and job.reopen is not None
        self.tallies = tallies
        self.on_written = on_written
        self.check = check
        self.peak_rss_mb = 0.0  # the largest worker process's, once they ended

    def run(self) -> None:
        if not self.cells:
            return
        workers = _Workers(self)
        with workers as next_message:
            while (message := next_message())[0] != "end":
                self._apply(message)
        self.peak_rss_mb = workers.peak_rss_mb

    def _apply(self, message: Message) -> None:
        kind, cell = message[0], message[1]
        if kind == "error":
            raise LoadError(message[2])
        tally = self.tallies[cell]
        if kind == "done":
            tally.fallbacks += int(message[2])
            return
        _, _, read, counts, reasons = message
        tally.read += read
        tally.written += counts["written"]
        tally.stale += counts["stale"]
        tally.rejected += counts["rejected"]
        tally.reasons.extend(reasons[: 5 - len(tally.reasons)])
        self.on_written(cell, read)


class _Workers:
    """Starts the workers; the context value returns the next message, ("end",) after
    the last worker left. Stops them all on the way out."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.alive = 0
        self.peak_rss_mb = 0.0
        self.procs: list[Any] = []

    def __enter__(self) -> Callable[[], Message]:
        loader = self.loader
        token: AbstractContextManager[Any]
        if loader.processes:
            ctx = multiprocessing.get_context("spawn")  # the parent holds threads, sockets
            self.tasks: Any = ctx.Queue()
            self.out: Any = ctx.Queue()
            self.stop: Any = ctx.Event()
            token = ctx.Lock()
        else:
            self.tasks, self.out, self.stop = queuelib.Queue(), queuelib.Queue(), threading.Event()
            single = loader.engine.capabilities.max_in_flight == 1
            token = threading.Lock() if single else nullcontext()
        self.token = token  # referenced until the workers end: its semaphore must live
        for cell in loader.cells:
            self.tasks.put(cell)
        for _ in range(loader.workers):
            if loader.processes:
                args = (loader.job, self.tasks, self.out, self.stop, token, os.getpid())
                proc: Any = ctx.Process(target=_process_worker, args=args, daemon=True)
            else:
                work_args = (loader.job, loader.engine, loader.engines, self.tasks, self.out)
                proc = threading.Thread(
                    target=_work, args=(*work_args, self.stop.is_set, token), daemon=True
                )
            proc.start()
            self.procs.append(proc)
        self.alive = len(self.procs)
        return self.next

    def next(self) -> Message:
        while self.alive:
            try:
                message: Message = self.out.get(timeout=1.0)
            except queuelib.Empty:
                self.loader.check()
                if not self.loader.processes or any(p.exitcode is None for p in self.procs):
                    continue
                try:
                    # Every worker has exited, but what they sent last may still be on its
                    # way: the wait above can give up just before it arrives (seen once in
                    # CI on a loaded machine, the workers' exit codes all 0).
                    message = self.out.get(timeout=EXITED_GRACE)
                except queuelib.Empty:
                    codes = sorted({p.exitcode for p in self.procs})
                    why = f"worker processes ended unexpectedly (exit codes {codes})"
                    raise LoadError(why) from None
            if message[0] == "exit":
                self.alive -= 1
                self.peak_rss_mb = max(self.peak_rss_mb, message[2])
                continue
            self.loader.check()
            return message
        return ("end",)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for proc in self.procs:
            if self.loader.processes and self.alive:
                # Stopped early: a worker mid-batch need not finish (its index goes).
                proc.terminate()
            proc.join(timeout=10)
