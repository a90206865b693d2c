"""``index verify`` as an operation: under the maintenance lock, with its report kept,
and periodically from the indexer process (``Settings.verify_interval``, off by default).

The periodic run repairs (that is its point: notifications lost before the bus, and
node documents, which only change through syncs and repairs) and logs what it found. It
skips a round when a sync or another verify holds the lock, and never lets a failure
stop the indexer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

from cellsight.cells.mappings import CellRegistry
from cellsight.indexer.engines.base import RESOURCES, SearchEngine
from cellsight.indexer.index_roles import LAST_VERIFY, made_ready
from cellsight.indexer.lock import LockHeld, MaintenanceLock
from cellsight.indexer.retries import retrying
from cellsight.indexer.verify import Verifier, VerifyReport
from cellsight.indexer.verify_report import VerifyInterrupted

log = logging.getLogger(__name__)


def verify_resource(
    engine: SearchEngine,
    registry: CellRegistry,
    resource: str,
    *,
    repair: bool = False,
    cells: Sequence[str] = (),
    workers: int = 4,
    batch_size: int = 10_000,
    on_start: Callable[[Sequence[tuple[str, str]]], None] = lambda cells: None,
    on_progress: Callable[[str, int], None] = lambda cell, n: None,
    stop: threading.Event | None = None,
) -> VerifyReport:
    """Verify ``resource`` (those ``cells``, names or uuids; default all). Raises
    ``LockHeld`` while a sync or another verify of the resource runs. ``stop``, set,
    stops the cells' comparison (what is under way is left as an interrupt leaves it),
    and the report of a run so cut short is not kept as the last verify's."""
    verifier: Verifier | None = None
    try:
        with MaintenanceLock(engine, resource, "verify") as lock:
            # What a killed sync left: its index behind the write alias would answer the
            # document reads (an orphan missing from it reads as removed) and keep growing.
            stopped = stop.is_set if stop is not None else (lambda: False)
            dropped = made_ready(
                engine,
                resource,
                lambda fn, what: retrying(fn, f"{resource} verify: {what}", stopped=stopped),
            )
            if dropped:
                log.warning("dropped what an unfinished %s sync left: %s", resource, dropped)
            # A cell named twice (by name and by uuid, say) is checked once.
            named = {c.uuid: c for c in (registry.get_cell(ref) for ref in cells)}
            chosen = list(named.values()) if cells else registry.list_cells()
            on_start([(c.uuid, c.name) for c in chosen])
            verifier = Verifier(
                engine,
                registry,
                resource,
                repair=repair,
                workers=workers,
                batch_size=batch_size,
                on_progress=on_progress,
                check=lock.check,
                abandon=lock.abandon,
                stop=stop,
            )
            report = verifier.run(chosen, whole=not cells)
        if stop is not None and stop.is_set():
            return report
        with contextlib.suppress(Exception):  # the figures are for `index status`
            engine.put_meta(LAST_VERIFY.format(resource=resource), summary(report))
    except KeyboardInterrupt as exc:
        # Before the cells' comparison or after it (the lock given back, the figures
        # kept), an interrupt still says what was repaired (CI: a SIGTERM just after the
        # lock was taken said "interrupted").
        if not repair or isinstance(exc, VerifyInterrupted):
            raise
        raise VerifyInterrupted(resource, verifier.repaired if verifier else 0) from exc
    return report


def summary(report: VerifyReport) -> dict[str, object]:
    """The report without per-cell samples: what ``index status`` shows."""
    cells = [
        {k: v for k, v in cell.items() if k not in ("samples",)}
        for cell in report.as_dict()["cells"]
    ]
    data = report.as_dict()
    data["cells"] = cells
    return data


def start_periodic_verify(
    engine: SearchEngine,
    registry: CellRegistry,
    interval: float,
    stop: threading.Event,
) -> threading.Thread:
    """A daemon thread that verifies and repairs every resource each ``interval``
    seconds until ``stop`` is set, which also stops a verify under way: join it before
    closing ``engine``."""

    def loop() -> None:
        while not stop.wait(interval):
            for resource in RESOURCES:
                if stop.is_set():
                    return
                _one_round(engine, registry, resource, stop)

    thread = threading.Thread(target=loop, name="anti-entropy", daemon=True)
    thread.start()
    log.info("anti-entropy: verifying and repairing every %.0f s", interval)
    return thread


def _one_round(
    engine: SearchEngine, registry: CellRegistry, resource: str, stop: threading.Event
) -> None:
    try:
        report = verify_resource(engine, registry, resource, repair=True, workers=2, stop=stop)
    except LockHeld as exc:
        log.info("anti-entropy: %s skipped: %s", resource, exc)
        return
    except Exception:  # the indexer keeps consuming whatever happens here
        if not stop.is_set():  # else a retry's backoff that the stop ended
            log.exception("anti-entropy: %s verify failed", resource)
            return
    if stop.is_set():  # cut short: its cells' "stopped" are no drift to report
        log.info("anti-entropy: %s verify stopped with the indexer", resource)
        return
    for cell in report.cells:
        if cell.drift or cell.errors:
            log.warning(
                "anti-entropy: %s in cell %s: %d missing, %d stale, %d orphaned; %d repaired%s",
                resource,
                cell.name,
                cell.missing,
                cell.stale,
                cell.orphaned,
                cell.repaired,
                f"; errors: {'; '.join(cell.errors)}" if cell.errors else "",
            )
    log.info(
        "anti-entropy: %s verified in %.1f s, drift %d", resource, report.seconds, report.drift
    )
