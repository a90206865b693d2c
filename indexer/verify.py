"""Anti-entropy: compare each cell's rows with the index by uuid and version, repair drift.

Per cell, the cell's ``(uuid, revision)`` rows in scope and the index's ``(id, version)``
documents of that cell are merge-joined in uuid order, neither loaded whole; documents
are built only for what needs repairing. Drift, per cell, with exact counts:

* **missing**: a row with no document (a notification lost before the bus);
* **stale**: a document older than its row (an update's notification lost);
* **orphaned**: a live document whose row is gone (archived, or never committed);
* **ahead** (reported): a document newer than its row, which only a restored cell
  database explains; an instance's is never repaired (Nova's own notifications are
  versioned by time: see the README's limits), a node's is rewritten; a full sync
  rebuilds every one. A tombstone ahead of a live row is drift (**hidden**): the row's
  next update would reach the tombstone's version and the server stay shown deleted.
  Not repaired either: removing it would race the live writer, and Elasticsearch
  refuses the lower version for a minute;
* **misfiled**: a row whose document is filed under another cell. Repair refiles it
  when the row's revision is above the document's version; otherwise it is reported
  (an error of the cell), and a full sync rebuilds it.

A row whose document is filed under another cell that holds a row of the same uuid, at
or above this row's revision, is a **twin**: indexed once, by the version rule, not drift.
A document filed under this cell whose row lives in another registered cell is not an
orphan here (``row_elsewhere``): it is never tombstoned, since its server is live. When
another cell cannot be read, this cell's orphans are reported and not tombstoned.

``repair`` rewrites exactly those, through the versioned write path with the row's
revision (documents built as a sync builds them), so a repair racing a fresher live
write loses, as it should. An orphan becomes a versioned tombstone (its stored version
+ 1, ``deleted`` set), as a delete would have: listed as deleted, retired by ``index
purge`` after the retention window, never resurrected by a late event; so tombstones
whose row is gone are not drift. An orphan's row is looked up once more before it
counts (one created after the stream passed its uuid is a live change in flight).
Orphaned node documents are removed."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial

import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.cells.errors import CellsError
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.indexer.cell_streams import IN_CHUNK, CellDocs, Scope, iter_versions, scope_of
from cellsight.indexer.daemon_map import map_in_daemons
from cellsight.indexer.engines.base import SearchEngine, StoredDocument, WriteOp, WriteResult
from cellsight.indexer.lock import LockLost
from cellsight.indexer.retries import retrying, write_retrying
from cellsight.indexer.row_documents import REPAIR_EVENT, tombstone
from cellsight.indexer.sync_request import RETRY_BACKOFF
from cellsight.indexer.verify_report import (
    AHEAD,
    HIDDEN,
    MISFILED,
    MISSING,
    ORPHANED,
    RECREATION_REFUSED,
    SAMPLES,
    TWIN,
    CellDrift,
    VerifyInterrupted,
    VerifyReport,
    VerifyStopped,
    brief,
    counted,
    diff,
    unrepaired,
)
from cellsight.indexer.write_gate import LinkedStop, WriteGate

log = logging.getLogger(__name__)


class Verifier:
    """Verify (and repair) ``resource``; ``index`` names a concrete index to check instead
    of the read alias (a sync's new index, repaired through ``bulk_index``)."""

    def __init__(
        self,
        engine: SearchEngine,
        registry: CellRegistry,
        resource: str,
        *,
        repair: bool = False,
        index: str | None = None,
        batch_size: int = 10_000,
        workers: int = 4,
        on_progress: Callable[[str, int], None] = lambda cell, n: None,
        backoff: float = RETRY_BACKOFF,
        check: Callable[[], None] = lambda: None,
        abandon: Callable[[], None] = lambda: None,
        stop: threading.Event | None = None,
    ) -> None:
        """``check`` runs before each repair write (the maintenance lock's: ``LockLost``),
        ``abandon`` if an interrupted run gives up waiting for one (``WriteGate.drain``);
        ``stop``, set, stops the cells' threads as an interrupt does."""
        self.engine = engine
        self.registry = registry
        self.resource = resource
        self.repair = repair
        self.index = index
        self.batch_size = batch_size
        self.workers = max(1, workers)
        self.on_progress = on_progress
        self.backoff = backoff  # before the first retry of a transient engine failure
        self.scope: Scope = scope_of(engine, resource, registry)
        # Interrupted: the cells' threads stop at their next chunk, not after their repairs.
        self._stop = threading.Event() if stop is None else LinkedStop(stop)
        self._gate = WriteGate(engine.capabilities.max_in_flight, self._stop, check, abandon)
        self._everywhere: list[CellMapping] = []
        self._seen: list[CellDrift] = []  # the cells begun: what an interrupt says

    def run(self, cells: Sequence[CellMapping], *, whole: bool = False) -> VerifyReport:
        """``whole``: the cells are all the registered ones, so documents outside them
        are counted too (``unattributed``)."""
        started = time.perf_counter()
        # Where an orphan's row might live: every registered cell, not only those compared.
        self._everywhere = self.registry.list_cells()
        target = self.index or self.engine.read_alias(self.resource)
        report = VerifyReport(
            self.resource, target, self.repair, datetime.now(UTC).isoformat(timespec="seconds")
        )
        # Counted before the cells: repairs and live writes during the run only add to
        # what the cells' streams count, so documents of no cell are never over-counted.
        total = None
        if whole and self.index is None:
            count = partial(self.engine.count, self.resource)
            what = f"counting {self.resource} documents"
            total = retrying(count, what, backoff=self.backoff, stopped=self._stop.is_set)
        # Ctrl-C or SIGTERM in the caller's thread: the cells stop at their next chunk,
        # and the caller releases its lock and closes the engine once no write is under way.
        try:
            report.cells = map_in_daemons(
                self._cell, cells, self.workers, "verify", on_interrupt=self._stop.set
            )
        except BaseException as exc:
            self._gate.drain()
            if self.repair and isinstance(exc, KeyboardInterrupt):
                raise VerifyInterrupted(self.resource, self.repaired) from exc
            if isinstance(exc, LockLost):  # a lost lock fails the run, as sync's and purge's
                done = f"{self.repaired:,} repaired before it stopped"
                raise type(exc)(f"{self.resource} verify stopped: {exc}; {done}") from exc
            raise
        if total is not None and not report.failed_cells:  # a failed cell's documents: uncounted
            report.unattributed = max(0, total - sum(c.documents for c in report.cells))
        report.seconds = round(time.perf_counter() - started, 3)
        return report

    @property
    def repaired(self) -> int:
        return sum(drift.repaired for drift in self._seen)

    def _cell(self, cell: CellMapping) -> CellDrift:
        drift = CellDrift(cell.uuid, cell.name)
        self._seen.append(drift)
        try:
            with connect(self.registry.cell_engine(cell)) as conn:
                self._compare(conn, cell, drift)
        except LockLost:
            raise  # the run's, not the cell's: every cell stops (the gate set the stop)
        except Exception as exc:  # one cell's failure must not hide the others' drift
            drift.failed = brief(exc)
            drift.errors.append(drift.failed)
        return drift

    def _compare(self, conn: sa.Connection, cell: CellMapping, drift: CellDrift) -> None:
        docs = CellDocs(self.scope, cell.uuid, REPAIR_EVENT)
        rows_seen, docs_seen = [0], [0]
        versions = iter_versions(conn, self.scope, self.batch_size)
        first = next(versions, None)
        # A cell without a single row, while the index holds its documents, is far more
        # often the wrong database than a cell all archived: its orphans are reported,
        # not tombstoned (a live server would be shown deleted, ahead of its next update).
        held = first is None
        rows = counted(versions if first is None else itertools.chain([first], versions), rows_seen)
        scan = self.engine.iter_versions(
            self.resource, cell.uuid, self.batch_size, index=self.index
        )
        stored = counted(scan, docs_seen)
        rewrite: dict[str, tuple[str, int]] = {}  # uuid → (missing or stale, revision)
        orphans: list[str] = []
        ahead: list[str] = []
        reported = 0
        for kind, uuid, version in diff(rows, stored):
            if self._stop.is_set():
                raise VerifyStopped(cell.name)
            if kind == ORPHANED:
                orphans.append(uuid)
            elif kind == MISSING:
                rewrite[uuid] = (kind, version)  # noted once told from misfiled
            else:
                drift.note(kind, uuid)
                if kind != AHEAD:
                    rewrite[uuid] = (kind, version)
                else:
                    ahead.append(uuid)
            if len(rewrite) >= IN_CHUNK:
                self._rewrite(conn, docs, rewrite, drift)
                rewrite = {}
            if len(orphans) >= IN_CHUNK:
                self._orphans(conn, docs, orphans, drift, held)
                orphans = []
            if len(ahead) >= IN_CHUNK:
                self._hidden(conn, docs, ahead, drift)
                ahead = []
            if rows_seen[0] - reported >= self.batch_size:
                self.on_progress(cell.uuid, rows_seen[0] - reported)
                reported = rows_seen[0]
        self._rewrite(conn, docs, rewrite, drift)
        self._orphans(conn, docs, orphans, drift, held)
        self._hidden(conn, docs, ahead, drift)
        self.on_progress(cell.uuid, rows_seen[0] - reported)
        drift.rows, drift.documents = rows_seen[0], docs_seen[0]
        if self.repair:
            drift.errors.extend(unrepaired(drift, self.resource, held))

    # Repairs ------------------------------------------------------------------------
    def _rewrite(
        self,
        conn: sa.Connection,
        docs: CellDocs,
        kinds: dict[str, tuple[str, int]],
        drift: CellDrift,
    ) -> None:
        missing = {uuid: version for uuid, (kind, version) in kinds.items() if kind == MISSING}
        filed = self._filed_elsewhere(docs.cell_uuid, list(missing))
        # The same uuid in two cells (Nova never makes one; a restore or a copy can): at
        # or above this row's revision the document is the version rule's choice, as the
        # sync's load made it (a twin); below it, this row is newer: refiled here.
        above = {u for u, (version, _) in filed.items() if version >= missing[u]}
        by_cell: dict[str, list[str]] = {}
        for uuid in above:
            by_cell.setdefault(filed[uuid][1], []).append(uuid)
        try:
            twins = self._rows_in(by_cell)
        except (sa.exc.SQLAlchemyError, CellsError):
            twins = set()  # a cell unreadable: misfiled, as before
        for uuid in twins:
            drift.note(TWIN, uuid)
            del missing[uuid], filed[uuid], kinds[uuid]
        for uuid in missing:
            drift.note(MISSING if uuid not in filed else MISFILED, uuid)
        # A misfiled document at or above the row's revision would refuse the rewrite.
        held = above - twins
        drift.misfiled_held += len(held)
        if not self.repair:
            return
        chosen = [uuid for uuid in kinds if uuid not in held]
        if chosen:
            self._write(docs.fetch(conn, chosen), drift, set(missing) - set(filed))

    def _filed_elsewhere(self, cell_uuid: str, uuids: list[str]) -> dict[str, tuple[int, str]]:
        """The stored version and cell of each of ``uuids`` filed under another cell."""
        stored = self._stored(uuids, fields=["cell_uuid"])
        return {
            uuid: (doc.version, cell)
            for uuid, doc in stored.items()
            if (cell := doc.document.get("cell_uuid")) not in (None, cell_uuid)
        }

    def _rows_in(self, wanted: dict[str, list[str]]) -> set[str]:
        """Which of the uuids wanted of each cell (by cell uuid) have a row there (raises
        when one cannot be read: an orphan must not be tombstoned on a guess)."""
        found: set[str] = set()
        for other in self._everywhere:
            uuids = [u for u in wanted.get(other.uuid, ()) if u not in found]
            if uuids:
                with connect(self.registry.cell_engine(other)) as conn:
                    found |= CellDocs(self.scope, other.uuid, REPAIR_EVENT).existing(conn, uuids)
        return found

    def _orphans(
        self, conn: sa.Connection, docs: CellDocs, uuids: list[str], drift: CellDrift, held: bool
    ) -> None:
        """Orphans are reported; with ``repair`` and not ``held``, tombstoned (nodes deleted)."""
        if not uuids:
            return
        repair = self.repair and not held
        in_flight = docs.existing(conn, uuids)
        candidates = [u for u in uuids if u not in in_flight]
        try:
            others = [c.uuid for c in self._everywhere if c.uuid != docs.cell_uuid]
            elsewhere = self._rows_in(dict.fromkeys(others, candidates))
        except (sa.exc.SQLAlchemyError, CellsError) as exc:
            elsewhere = set()
            if repair:
                drift.errors.append(f"orphans not repaired: another cell unreadable ({brief(exc)})")
            repair = False
        drift.row_elsewhere += len(elsewhere)
        candidates = [u for u in candidates if u not in elsewhere]
        # A row deleted before the purge floor is out of scope, not gone: its document is
        # one the purge would have removed (a tombstone built from it would carry the
        # wrong deletion time and list the server where the fan-out does not).
        below = docs.existing(conn, candidates, purged=True) if candidates else set()
        for uuid in below:
            drift.note(ORPHANED, uuid)
        if repair and below:
            with self._writing(drift):
                drift.repaired += self.engine.delete(self.resource, sorted(below))
        candidates = [u for u in candidates if u not in below]
        if self.resource == "node":
            for uuid in candidates:
                drift.note(ORPHANED, uuid)
            if repair and candidates:
                with self._writing(drift):
                    drift.repaired += self.engine.delete("node", candidates)
            return
        stored = self._stored(candidates)
        tombstones = []
        for uuid in candidates:
            doc = stored.get(uuid)
            if doc is None:
                continue  # removed meanwhile (a purge)
            if doc.document.get("deleted"):
                drift.tombstones_without_row += 1
                continue
            drift.note(ORPHANED, uuid)
            tombstones.append(tombstone(doc))
        if repair:
            self._write(tombstones, drift)

    def _hidden(
        self, conn: sa.Connection, docs: CellDocs, uuids: list[str], drift: CellDrift
    ) -> None:
        """Tombstones ahead of a live row (the module's **hidden**), told from a change in
        flight by reading the row again; node documents ahead of theirs, rewritten."""
        if not uuids:
            return
        if self.resource == "node":
            self._nodes_ahead(conn, docs, uuids, drift)
            return
        stored = self._stored(uuids, fields=["deleted"])
        tombstoned = [u for u, doc in stored.items() if doc.document.get("deleted")]
        for op in docs.fetch(conn, tombstoned) if tombstoned else []:
            if not op.document.get("deleted") and op.version < stored[op.id].version:
                drift.note(HIDDEN, op.id)

    def _nodes_ahead(
        self, conn: sa.Connection, docs: CellDocs, uuids: list[str], drift: CellDrift
    ) -> None:
        """Only Cellsight's producers write node documents, by the row's revision: one
        still ahead when its row is read again is a restored database's, and it kept
        serving the old figures for good (a probe). Deleted, then written from the row;
        a live write racing it leaves at worst a stale document, the next verify's."""
        stored = self._stored(uuids, fields=["cell_uuid"])
        behind = [op for op in docs.fetch(conn, uuids) if op.id in stored]
        behind = [op for op in behind if op.version < stored[op.id].version]
        drift.node_ahead += len(behind)
        if self.repair and behind:
            with self._writing(drift):
                self.engine.delete("node", [op.id for op in behind])
            self._write(behind, drift, {op.id for op in behind})

    def _write(self, ops: list[WriteOp], drift: CellDrift, missing: set[str] | None = None) -> None:
        """Versioned writes, transient failures retried; a STALE answer means a newer
        live write won, except for a document that was missing: Elasticsearch and
        OpenSearch refuse to recreate it below a deleted one's version for
        ``index.gc_deletes`` (60 s): counted ``repair_refused``, the next verify writes it."""
        if not ops:
            return
        what = f"{self.resource} repairs of {drift.name}"
        with self._writing(drift):
            written = write_retrying(
                self._send, ops, what, backoff=self.backoff, stopped=self._stop.is_set
            )
        refused = drift.tally(written, missing or set())
        # A live write that created the document meanwhile also answers STALE.
        created = self._stored(refused)
        drift.repair_lost_to_newer += len(created)
        for uuid in refused:
            if uuid not in created:
                drift.repair_refused += 1
                if len(drift.errors) < SAMPLES:
                    drift.errors.append(f"{uuid}: {RECREATION_REFUSED}")

    def _writing(self, drift: CellDrift) -> contextlib.AbstractContextManager[None]:
        return self._gate.writing(lambda: VerifyStopped(drift.name))

    def _stored(
        self, uuids: list[str], fields: list[str] | None = None
    ) -> dict[str, StoredDocument]:
        """The documents of the index checked: a sync's new index alone, not the old one
        behind the same write alias (a twin filed differently there would be found)."""
        if not uuids:
            return {}
        read = partial(self.engine.get_many, self.resource, uuids, fields=fields, index=self.index)
        return retrying(read, "reading documents", backoff=self.backoff, stopped=self._stop.is_set)

    def _send(self, ops: list[WriteOp]) -> Sequence[WriteResult]:
        if self.index is None:
            return self.engine.bulk(ops)
        return list(self.engine.bulk_index(self.index, iter(ops), chunk_size=len(ops)))
