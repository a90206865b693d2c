"""The periodic relay: every cell's outbox, pass after pass, beside the indexer or as
``cellsight outbox relay --every``; a cell that cannot take its deletes is backed off,
and a cell that does not answer holds only its own thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from cellsight.cells.errors import CellsError
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.outbox import Outbox, RelayReport, ensure_tables, said

log = logging.getLogger(__name__)

BACKOFF_MAX = 300.0  # seconds between passes at a cell whose deletes keep failing
RELAY_THREADS = 8  # cells relayed at once by one pass


def relay_cells(
    registry: CellRegistry, relay: Outbox, cells: Iterable[str] | None = None
) -> dict[str, RelayReport]:
    """One relay pass over the named cells (default: every cell), keyed by cell name.

    A cell that cannot be reached gets a report with its error; the others go on.
    """
    chosen = [registry.get_cell(c) for c in cells] if cells is not None else registry.list_cells()
    return relay_mapped(registry, relay, chosen)


def relay_mapped(
    registry: CellRegistry, relay: Outbox, cells: Sequence[CellMapping]
) -> dict[str, RelayReport]:
    """``relay_cells`` over cells already read from the registry, several at once: a
    cell whose database stops answering holds only its own thread (until the statement
    timeout), not every cell after it."""
    if len(cells) <= 1:
        return {cell.name: relay_one(registry, relay, cell) for cell in cells}
    with ThreadPoolExecutor(min(RELAY_THREADS, len(cells)), "outbox-relay") as pool:
        try:
            # ``map`` starts the threads: an interrupt may land there (a review).
            reports = pool.map(lambda cell: relay_one(registry, relay, cell), cells)
            return {cell.name: report for cell, report in zip(cells, reports, strict=True)}
        except KeyboardInterrupt:
            # Ctrl-C, or SIGTERM raised as it: the pool's exit waits for its threads,
            # which end at their next batch, not with their cells' whole backlogs.
            relay.stop.set()
            raise


def relay_one(registry: CellRegistry, relay: Outbox, cell: CellMapping) -> RelayReport:
    """One cell's relay; a cell that cannot be reached gets a report with its error."""
    try:
        engine = registry.cell_engine(cell)
        ensure_tables(engine)
        return relay.relay(engine)
    except (CellsError, sa.exc.SQLAlchemyError) as exc:
        return RelayReport(left=None, error=f"cell {cell.name}: {said(exc)}")


def start_periodic_relay(
    registry: CellRegistry,
    relay: Outbox,
    interval: float,
    stop: threading.Event,
    *,
    settle: float = 30.0,
) -> threading.Thread:
    """Relay every cell's outbox every ``interval`` seconds until ``stop`` is set.

    Each cell is relayed on a thread of its own, at most one at a time per cell: a pass
    does not wait for a cell still being relayed (its database slow or not answering),
    so the other cells keep their pace. Once ``stop`` is set, the loop waits up to
    ``settle`` seconds for the passes under way (their publishes confirmed, their rows
    deleted) before it ends: join it before closing the relay's publisher. The threads
    are daemons, as the loop's is: a process that stops does not wait longer for a cell
    that does not answer.
    """
    # Refused here, in the caller's thread: past TIMEOUT_MAX (or inf, nan) the first
    # ``stop.wait`` raised inside the thread, which died while the caller waited for ever.
    if not 0 < interval <= threading.TIMEOUT_MAX:
        raise ValueError(f"relay interval {interval!r} s: not in (0, {threading.TIMEOUT_MAX:g}]")

    backoff = CellBackoff(interval)
    guard = threading.Lock()  # the backoff and the cells under way
    under_way: set[str] = set()

    def visit(cell: CellMapping) -> None:
        try:
            report = relay_one(registry, relay, cell)
            if report.error:
                # Its notifications wait in the outbox: the operator should know.
                log.warning("outbox relay %s: %s", cell.name, report.error)
            elif report.published:
                log.info("outbox relay %s: %s", cell.name, report.as_dict())
            with guard:
                backoff.record(cell.name, failed=report.unremoved > 0)
        except Exception:
            log.exception("outbox relay of cell %s failed", cell.name)
        finally:
            with guard:
                under_way.discard(cell.name)

    visits: list[threading.Thread] = []

    def loop() -> None:
        try:
            passes()
        finally:
            deadline = time.monotonic() + settle
            for visit_thread in visits:
                visit_thread.join(max(0.0, deadline - time.monotonic()))

    def passes() -> None:
        while not stop.wait(interval):
            try:
                cells = registry.list_cells()
                with guard:
                    due = set(backoff.due([c.name for c in cells])) - under_way
                    chosen = [c for c in cells if c.name in due]
                    under_way.update(due)
                visits[:] = [t for t in visits if t.is_alive()]
                for cell in chosen:
                    name = f"outbox-relay-{cell.name}"
                    visit_thread = threading.Thread(
                        target=visit, args=(cell,), name=name, daemon=True
                    )
                    visit_thread.start()
                    visits.append(visit_thread)
            except Exception:
                # The relay is a safety net beside the indexer: log and try next time.
                log.exception("outbox relay pass failed")

    thread = threading.Thread(target=loop, name="outbox-relay", daemon=True)
    thread.start()
    return thread


class CellBackoff:
    """Which cells a periodic relay visits: after a pass that published a batch and
    could not delete it (a cell's full disk), every pass would publish it again, about a
    hundred duplicates each ``interval``; such a cell waits twice as long after each such
    pass, up to ``BACKOFF_MAX``, and is visited every pass again once one succeeds."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._failures: dict[str, int] = {}
        self._next: dict[str, float] = {}

    def due(self, names: Sequence[str]) -> list[str]:
        now = self.clock()
        return [n for n in names if self._next.get(n, now) <= now]

    def record(self, name: str, *, failed: bool) -> None:
        if not failed:
            self._failures.pop(name, None)
            self._next.pop(name, None)
            return
        n = self._failures[name] = self._failures.get(name, 0) + 1
        # The exponent capped: 2**1024 as a float overflows (a disk full for days).
        wait = min(self.interval * 2.0 ** min(n, 32), max(BACKOFF_MAX, self.interval))
        self._next[name] = self.clock() + wait
        log.warning("outbox relay %s: next pass at this cell in %.3g s", name, wait)
