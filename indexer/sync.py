"""Bulk sync: backfill or rebuild a resource's index from the cells with zero downtime.

A full sync, holding the maintenance lock (``cellsight.indexer.lock``):

1. finishes what an unfinished sync left (``layout.clean_up``), then creates a new
   index from the generated mapping with refresh off and no replicas;
2. points the write alias at the serving index *and* the new one: the engines' ``bulk``
   writes every live notification to both from then on;
3. streams every cell (``loader``) into the new index through the engine's streaming
   bulk helper, each document carrying its row's revision as external version. A row
   committed before step 2 is read by the stream (which starts after it); one changed
   later also reaches the new index through the live path with a higher revision, and
   the versioned writes let the newer copy win whichever lands first. A transient
   engine failure of a write, or of a step from 2 to the swap in 4 (each can run
   twice), is retried with backoff a bounded number of times (``retries``);
4. restores refresh and replicas, compares each cell's rows with the new index's
   documents of that cell (a difference left by changes still in flight is caught up
   from the cells with versioned writes, then compared again), swaps the read and write
   aliases to the new index in one atomic call, writes the synced marker
   (``layout.marker_key``), and drops retired indexes beyond ``keep_old``;
5. on any failure or interrupt before the swap, points the aliases back as they were
   and deletes the new index, then raises ``SyncFailed`` saying what failed. A sync
   killed outright cannot clean up: its index is a *stray* that the next sync removes.

``cells`` (``--cell``) syncs only those cells, into the serving index through the write
alias with the same versioned writes: missing and older documents are replaced, newer
ones kept, other cells' documents untouched. No new index, the synced marker unchanged.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from cellsight.cells.database import connect
from cellsight.cells.errors import UnknownCell
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.indexer.cell_streams import CellRef, Scope, count_rows, scope_of
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.index_roles import (
    LAST_SYNC,
    layout,
    made_ready,
    marker_key,
    new_index_name,
    restore,
    restored_failed,
    retire,
)
from cellsight.indexer.lock import TTL, LockHeld, LockLost, MaintenanceLock
from cellsight.indexer.purge import raise_floor
from cellsight.indexer.retries import retrying
from cellsight.indexer.row_documents import SYNC_EVENT
from cellsight.indexer.sync_loader import PROCESS_MIN_ROWS, CellTally, Loader, LoadJob
from cellsight.indexer.sync_request import (
    NoProgress,
    SyncFailed,
    SyncInterrupted,
    SyncOptions,
    SyncProgress,
    SyncReport,
)
from cellsight.indexer.verify import Verifier
from cellsight.indexer.verify_report import brief
from cellsight.notifications.errors import plural
from cellsight.signal_events import signals_held

__all__ = ["SyncFailed", "SyncInterrupted", "SyncOptions", "SyncReport", "run_sync"]

T = TypeVar("T")
INTERRUPTS = (KeyboardInterrupt, SystemExit)  # stopped from outside: Ctrl-C, SIGTERM, an exit


def run_sync(
    engine: SearchEngine,
    registry: CellRegistry,
    options: SyncOptions,
    *,
    progress: SyncProgress | None = None,
    lock_ttl: float = TTL,
) -> SyncReport:
    """Raises ``LockHeld`` when another sync, verify or purge runs, ``UnknownCell`` for a cell
    it cannot find, ``SyncFailed`` otherwise."""
    run = _Run(engine, registry, options, progress or NoProgress())
    try:
        with MaintenanceLock(engine, options.resource, "sync", ttl=lock_ttl) as lock:
            run.lock = lock
            report = run.partial() if options.cells else run.full()
    except (SyncFailed, LockHeld, UnknownCell):  # a cell named wrong is a usage error
        raise
    except INTERRUPTS as exc:
        raise SyncInterrupted(f"{options.resource} sync interrupted; nothing changed") from exc
    except Exception as exc:  # before the new index existed, or reading the cells
        raise SyncFailed(f"{options.resource} sync failed: {_said(exc)}") from exc
    report.finished_at = datetime.now(UTC).isoformat()
    report.seconds = round(time.perf_counter() - run.started, 3)
    # The figures are for `index status`; the sync itself succeeded either way.
    with contextlib.suppress(Exception):
        engine.put_meta(LAST_SYNC.format(resource=options.resource), report.as_dict())
    return report


class _Run:
    def __init__(
        self,
        engine: SearchEngine,
        registry: CellRegistry,
        options: SyncOptions,
        progress: SyncProgress,
    ) -> None:
        if options.resource not in ("instance", "node"):
            raise SyncFailed(f"unknown resource type {options.resource!r}")
        self.engine = engine
        self.registry = registry
        self.options = options
        self.resource = options.resource
        self.progress = progress
        self.started = time.perf_counter()
        self.lock: MaintenanceLock | None = None
        self.report = SyncReport(self.resource, "cells" if options.cells else "full")

    def check(self, *, fresh: bool = False) -> None:
        if self.lock is not None:
            self.lock.check(fresh=fresh)

    def abandon(self) -> None:
        if self.lock is not None:
            self.lock.abandon()

    def _lost(self, exc: BaseException) -> LockLost | None:
        """Why the lock is no longer this run's, asked now, or None: it still is."""
        try:
            self.check(fresh=True)
        except LockLost as lost:
            return type(lost)(f"{_said(exc)} ({lost})")
        return None

    def _retrying(self, fn: Callable[[], T], what: str) -> T:
        """``fn`` retried like the load's writes: a step after the load must not throw
        the load away over one timeout. The lock is checked before each attempt: a
        lock lost during the retries belongs to another sync, and so do the aliases."""

        def attempt() -> T:
            self.check()
            return fn()

        what = f"{self.resource} sync: {what}"
        return retrying(attempt, what, backoff=self.options.retry_backoff)

    def _prepare(self) -> list[str]:
        return made_ready(self.engine, self.resource, self._retrying)

    def _cells(self) -> list[CellMapping]:
        if not self.options.cells:
            cells = self.registry.list_cells()
            if not cells:
                # A full sync's index would hold nothing, swapped in and marked synced:
                # every listing empty. The likely cause is the wrong API database (a
                # setting left unset falls back to an empty one), not a cluster without
                # cells. (Cells named by ``--cell`` are found, or ``UnknownCell``.)
                raise SyncFailed(
                    f"{self.resource} sync refused: the API database has no cells "
                    "registered, so the new index would be empty; check api_db_url, or "
                    "register cells first (cellsight cells add)"
                )
            return cells
        chosen = {c.uuid: c for c in (self.registry.get_cell(ref) for ref in self.options.cells)}
        return list(chosen.values())

    def _count(self, scope: Scope, cell: CellMapping) -> int:
        with connect(self.registry.cell_engine(cell)) as conn:
            return count_rows(conn, scope)

    def _load(
        self, scope: Scope, cells: list[CellMapping], index: str | None
    ) -> dict[str, CellTally]:
        """Stream ``cells`` into ``index`` (``bulk_index``), or with ``index`` None into
        the write alias (``bulk``)."""
        tallies = {c.uuid: CellTally(c.uuid, c.name) for c in cells}
        for cell in cells:
            try:
                tallies[cell.uuid].expected = self._count(scope, cell)
            except Exception as exc:
                # the driver's first line: a CLI error is one line, without the SQL
                raise SyncFailed(f"cell {cell.name} is unreadable: {brief(exc)}") from exc
        total = sum(t.expected for t in tallies.values())
        # Worker processes open their own: pooled connections to every cell would sit
        # here for the whole load, each with its page cache.
        self.registry.engines.dispose()
        reopen = None
        if self.engine.capabilities.worker_processes:
            reopen = self.engine.reopener()
        processes = self.options.processes
        if processes is None:
            processes = total >= PROCESS_MIN_ROWS and self.resource == "instance"
        processes = processes and reopen is not None
        # Processes: one writes while the others build (see loader). Threads: concurrent
        # bulk requests for a cluster; two for an engine that writes one at a time.
        single = self.engine.capabilities.max_in_flight == 1
        default = (os.cpu_count() or 2) if processes else 2 if single else 4
        job = LoadJob(
            scope,
            SYNC_EVENT,
            self.options.batch_size,
            self.registry.engines.timeouts,
            index=index,
            reopen=reopen,
            backoff=self.options.retry_backoff,
        )
        loader = Loader(
            [CellRef(c.uuid, c.name, c.database_url) for c in cells],
            job,
            engine=self.engine,
            engines=self.registry.engines,
            workers=self.options.workers or default,
            processes=processes,
            tallies=tallies,
            on_written=self.progress.advance,
            check=self.check,
        )
        self.report.worker_kind = "processes" if loader.processes else "threads"
        self.report.workers = loader.workers
        self.progress.start_cells([(t.uuid, t.name, t.expected) for t in tallies.values()])
        self.progress.phase(
            f"loading {total:,} {self.resource} rows from {plural(len(cells), 'cell')}"
        )
        loader.run()
        self.report.workers_peak_rss_mb = loader.peak_rss_mb
        self.report.rows = sum(t.read for t in tallies.values())
        bad = [t for t in tallies.values() if t.rejected]
        if bad:
            detail = "; ".join(f"{t.name}: {t.rejected} ({', '.join(t.reasons[:2])})" for t in bad)
            raise SyncFailed(f"documents rejected by the engine: {detail}")
        return tallies

    # Full sync ---------------------------------------------------------------------------
    def full(self) -> SyncReport:
        engine, resource, report = self.engine, self.resource, self.report
        # Both records hold the higher floor: an engine that came back empty lost the one
        # the writer guards with, and a purge before the API database kept one recorded
        # it in the index only.
        floor = raise_floor(engine, self.registry) if resource == "instance" else None
        scope = Scope(resource, floor)
        cells = self._cells()
        report.cleaned_up = self._prepare()
        current = self._retrying(lambda: layout(engine, resource), "reading the indexes")
        if current.serving is None:
            raise SyncFailed(f"the {engine.read_alias(resource)} alias does not name one index")
        old_read, old_write = current.serving.name, list(current.writers)
        new = new_index_name(engine, resource)
        report.index, report.previous_index = new, old_read
        self.progress.phase(f"creating {new}")
        try:
            # Not retried: a create that timed out may have created the index.
            engine.create_index(resource, new, bulk_load=True)
            writers = [*old_write, new]
            self._retrying(
                lambda: engine.set_aliases(resource, read=old_read, write=writers),
                f"writing to {new} too",
            )
            tallies = self._load(scope, cells, new)
            self.progress.phase(f"finishing {new}: indexes, refresh, replicas")
            self._retrying(lambda: engine.finish_bulk_load(new), f"finishing {new}")
            self.check()
            self.progress.phase("comparing document counts with the cells")
            self._check_counts(scope, cells, new, tallies)
            self.check(fresh=True)  # the swap changes what serves
            # set_aliases changes what differs from the aliases it reads: run twice (the
            # first attempt applied, its answer lost) it changes nothing the second time.
            self._retrying(
                lambda: engine.set_aliases(resource, read=new, write=[new]),
                f"swapping the aliases to {new}",
            )
        except BaseException as exc:
            # Lost, the lock's aliases are another sync's: only ours dropped. (Asked, not
            # read from the error: a sync paused past its expiry failed.) A second
            with signals_held():  # interrupt waits for the clean-up (a review).
                why = exc if isinstance(exc, LockLost) else self._lost(exc) or exc
                held = not isinstance(why, LockLost)
                problems = restore(engine, resource, new, (old_read, old_write) if held else None)
            raise self._failure(why, new, old_read, problems) from exc
        report.cells = [t.as_dict() for t in tallies.values()]
        try:
            report.documents = engine.count(resource, index=new)
            engine.put_meta(marker_key(resource), report.marker(new, engine.distribution))
        except Exception as exc:
            raise SyncFailed(
                f"{new} serves now, but the synced marker could not be written ({exc}): the "
                "API keeps to the cells until a sync completes"
            ) from exc
        except INTERRUPTS as exc:  # past the swap: not "nothing changed"
            raise SyncInterrupted(
                f"{resource} sync interrupted after {new} began to serve, before its synced "
                "marker was written: the API keeps to the cells until a sync completes"
            ) from exc
        try:
            report.dropped, report.kept = retire(engine, resource, self.options.keep_old)
        except Exception as exc:  # the next sync retires them
            report.kept.append(f"(could not drop old indexes: {exc})")
        except INTERRUPTS as exc:
            raise SyncInterrupted(
                f"{resource} sync interrupted after it completed: {new} serves and is "
                "synced; the old indexes are dropped by the next sync"
            ) from exc
        return report

    def _failure(self, exc: BaseException, new: str, old_read: str, errs: list[str]) -> SyncFailed:
        what = "was interrupted" if isinstance(exc, INTERRUPTS) else f"failed: {_said(exc)}"
        if isinstance(exc, LockLost):  # not this run's aliases to restore now
            serving = f"its lock was lost: the aliases are {exc.aliases}"
            left = f"{serving}; {'; '.join(errs) or f'{new} was deleted'}"
        elif errs:
            serves = [] if restored_failed(errs) else [f"{old_read} still serves"]
            left = f"{'; '.join([*serves, *errs])} (the next sync cleans up)"
        else:
            left = f"{old_read} still serves and {new} was deleted"
        message = f"{self.resource} sync {what}. {left}"
        return SyncInterrupted(message) if isinstance(exc, INTERRUPTS) else SyncFailed(message)

    def _check_counts(
        self, scope: Scope, cells: list[CellMapping], new: str, tallies: dict[str, CellTally]
    ) -> None:
        """Each cell's rows against the new index's documents of that cell. A cell that
        differs is compared row by row (versions only) and what the index lacks is
        written from the cell: on a live system the difference is changes in flight,
        which the write alias also delivers, so only a failed catch-up fails the sync."""
        off = [cell for cell in cells if not self._counts_match(scope, cell, new, tallies)]
        if not off:
            return
        verifier = Verifier(
            self.engine,
            self.registry,
            self.resource,
            repair=True,
            index=new,
            backoff=self.options.retry_backoff,
            check=self.check,
            abandon=self.abandon,
        )
        result = verifier.run(off)
        self.report.caught_up += sum(c.repaired for c in result.cells)
        self.report.twins += sum(c.twin for c in result.cells)
        failed = [c for c in result.cells if c.errors or c.repair_failed]
        if failed:
            detail = "; ".join(f"{c.name}: {', '.join(c.errors[:3])}" for c in failed)
            raise SyncFailed(f"catching up with the cells failed ({detail})")
        for cell in off:
            self._counts_match(scope, cell, new, tallies)

    def _counts_match(
        self, scope: Scope, cell: CellMapping, new: str, tallies: dict[str, CellTally]
    ) -> bool:
        tally = tallies[cell.uuid]
        tally.rows_now = self._count(scope, cell)
        tally.documents = self._retrying(
            lambda: self.engine.count(self.resource, cell.uuid, index=new),
            f"counting {cell.name}'s documents",
        )
        return tally.rows_now == tally.documents

    # Partial sync -------------------------------------------------------------------------
    def partial(self) -> SyncReport:
        engine, resource, report = self.engine, self.resource, self.report
        scope = scope_of(engine, resource, self.registry)
        cells = self._cells()
        report.cleaned_up = self._prepare()
        serving = self._retrying(lambda: layout(engine, resource), "reading the indexes").serving
        report.index = serving.name if serving else None
        try:
            tallies = self._load(scope, cells, None)
        except BaseException as exc:
            names = ", ".join(c.name for c in cells)
            kept = "the documents written so far stay (versioned writes: none went backwards)"
            if isinstance(exc, INTERRUPTS):
                raise SyncInterrupted(
                    f"{resource} sync of {names} was interrupted; {kept}"
                ) from exc
            raise SyncFailed(f"{resource} sync of {names} failed: {_said(exc)}; {kept}") from exc
        for cell in cells:
            tally = tallies[cell.uuid]
            tally.rows_now = self._count(scope, cell)
            tally.documents = engine.count(resource, cell.uuid)
        report.cells = [t.as_dict() for t in tallies.values()]
        report.documents = sum(t.documents or 0 for t in tallies.values())
        return report


def _said(exc: BaseException) -> str:
    """A failure in one line: the sync's own errors as they say it, a database error in
    the driver's words (``brief``)."""
    return str(exc) if isinstance(exc, SyncFailed | LockLost) else brief(exc)
