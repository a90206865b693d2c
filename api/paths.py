"""Which path answers a listing, and the index path itself.

``InstanceSearch.search`` scopes the request (a non-administrator sees only their
project), then asks the index when it may (a completed bulk sync marked the serving
index synced, ``cellsight.indexer.index_roles.is_synced``, and the safe-connect flag is clear), and
otherwise, or when the index fails, fans out over the cells. Both paths return
documents in the same form (``comparable``), so what is rendered from them is the same.

Both paths leave out instances deleted before the purge floor: ``index purge`` removed
their tombstones from the index, while the cells keep the rows (as Nova keeps them until
it archives them). The floor is the higher of the index's record and the API database's
(``cellsight.api.purge_floor``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cellsight.api.auth import Principal
from cellsight.api.driver_errors import API_DB_FAILURES
from cellsight.api.errors import unavailable
from cellsight.api.fanout import FanOut, Saturated, SkippedCell
from cellsight.api.index_admission import IndexAdmission
from cellsight.api.index_probe import DeferredEngine
from cellsight.api.markers import marker_document
from cellsight.api.merge_order import sort_values
from cellsight.api.metrics import ApiMetrics
from cellsight.api.null_tail import tail
from cellsight.api.purge_floor import PurgeFloors
from cellsight.api.render import Unreachable
from cellsight.api.safe_connect import SafeConnect
from cellsight.api.yardstick import Yardstick
from cellsight.cells.database import connect
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.schema import instance_mappings
from cellsight.indexer.documents import comparable
from cellsight.indexer.engines.base import EngineError, EngineTimeout, SearchEngine
from cellsight.indexer.fields import NEVER_NULL
from cellsight.indexer.index_roles import is_synced
from cellsight.query.tree import (
    Compare,
    Not,
    Op,
    Scalar,
    SearchRequest,
    SortKey,
    conjunction,
)

log = logging.getLogger(__name__)

# How long a "not synced yet" answer is trusted before the marker is read again.
UNSYNCED_RECHECK_S = 5.0


@dataclass
class Page:
    documents: list[dict[str, Any]]
    path: str  # "index" or "fanout"
    reason: str
    skipped: list[SkippedCell] = field(default_factory=list)
    rows_read: dict[str, int] = field(default_factory=dict)


def without_purged(request: SearchRequest, floor: datetime | None) -> SearchRequest:
    """``request`` without the instances deleted before ``floor``.

    A document with ``deleted_at`` is deleted (``documents.is_deleted``), so this is the
    purge's own rule (deleted, and ``deleted_at`` before the floor); a null ``deleted_at``
    is kept on every path (a negated comparison matches a missing value).
    """
    if floor is None:
        return request
    purged = Not(Compare("deleted_at", Op.LT, floor))
    return replace(request, filter=conjunction(request.filter, purged))


def scope(request: SearchRequest, principal: Principal, project: str | None) -> SearchRequest:
    """``request`` restricted to the one project a principal may list."""
    if not principal.is_admin:
        project = principal.project_id
    if project is None:
        return request
    only = Compare("tenant_id", Op.EQ, project)
    return replace(request, filter=conjunction(request.filter, only))


class InstanceSearch:
    def __init__(
        self,
        registry: CellRegistry,
        engine: SearchEngine,
        fanout: FanOut,
        safe_connect: SafeConnect,
        metrics: ApiMetrics | None = None,
        *,
        per_project_cells: bool = False,
        index_searches: int = 16,
        admission_wait: float = 2.0,
    ) -> None:
        self.registry = registry
        self.per_project_cells = per_project_cells
        self.engine = engine
        self.fanout = fanout
        self.safe_connect = safe_connect
        self.metrics = metrics or ApiMetrics()
        self.admission = IndexAdmission(index_searches, admission_wait, self.metrics)
        self._synced = False
        self._unsynced_at: float | None = None
        self._identity: Hashable = None  # the store whose marker was read
        self._floors = PurgeFloors(engine, registry, self.metrics)
        self._lock = threading.Lock()
        self.yardstick = Yardstick(engine)

    # ------------------------------------------------------------ the decision

    def _is_synced(self) -> bool:
        """Whether bulk sync has completed; raises ``EngineError`` if the engine fails.

        A store put in the place of the one whose marker was read (the embedded index's
        file removed, and made again by the indexer) has its marker read again at once,
        not at the next probe: until a sync it is unsynced, and the cells answer."""
        identity = self.engine.store_identity()
        with self._lock:
            if identity != self._identity:
                self._synced, self._unsynced_at = False, None
            if self._synced:
                return True
            if self._unsynced_at is not None and (
                time.monotonic() - self._unsynced_at < UNSYNCED_RECHECK_S
            ):
                return False
        synced = is_synced(self.engine, "instance")
        # This reading, not the shared flag: a probe may record an older store's meanwhile.
        self._record(synced, identity)
        return synced

    def _record(self, synced: bool, identity: Hashable) -> None:
        with self._lock:
            self._synced, self._identity = synced, identity
            self._unsynced_at = None if synced else time.monotonic()

    def _read_floor(self, *, force: bool = False) -> None:
        """Refresh the index's purge floor; raises ``EngineError`` if it fails."""
        self._floors.read_index(force=force)

    @property
    def purge_floor(self) -> datetime | None:
        """The purge floor both paths apply (None: none recorded)."""
        return self._floors.value()

    def probe(self) -> str:
        """One background probe: connect if need be, read the synced marker. A success
        clears the safe-connect flag; the result is for ``/readyz`` and the metrics."""
        try:
            if isinstance(self.engine, DeferredEngine):
                self.engine.connect()
            identity = self.engine.store_identity()
            synced = is_synced(self.engine, "instance")
            self._read_floor(force=True)
        except EngineError as exc:
            self.safe_connect.failed(exc)
            return f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
        except Exception as exc:  # a bug: counted and logged; the thread must go on
            self.metrics.bug("index probe", exc, log)
            return f"error: {type(exc).__name__}"
        self._record(synced, identity)
        self.safe_connect.succeeded(searched=False)
        return "synced" if synced else "unsynced: not marked synced by a completed bulk sync"

    def mark_unsynced(self) -> None:
        """Forget the synced marker (a new sync is starting, or tests)."""
        with self._lock:
            self._synced = False
            self._unsynced_at = None

    def choose(self) -> tuple[str, str, bool]:
        """(path, why, whether this request probes the index) for the next request; a
        probe's failure sets the flag."""
        use, probe = self.safe_connect.try_index()
        if not use:
            reason = self.safe_connect.status().get("reason", "")
            return "fanout", f"safe-connect flag set: {reason}", False
        try:
            synced = self._is_synced()
            # Read even when not synced: the floor holds for the cells' rows either way.
            self._read_floor()
        except EngineError as exc:
            self.safe_connect.failed(exc)
            return "fanout", f"index failed: {exc}", False
        if not synced:
            if probe:
                self.safe_connect.release_probe()
            return "fanout", "index not marked synced by a completed bulk sync", False
        return "index", "index synced and answering", probe

    # -------------------------------------------------------------- listing

    def search(
        self,
        request: SearchRequest,
        principal: Principal,
        *,
        project: str | None = None,
        prefer_index: bool = True,
    ) -> Page:
        page = self._search(request, principal, project, prefer_index)
        rest = tail(request, len(page.documents), NEVER_NULL["instance"])
        if rest is None:
            return page
        more = self._search(rest, principal, project, prefer_index)
        rows_read = dict(page.rows_read)
        for cell, rows in more.rows_read.items():
            rows_read[cell] = rows_read.get(cell, 0) + rows
        named = {s.uuid for s in page.skipped}
        skipped = page.skipped + [s for s in more.skipped if s.uuid not in named]
        return replace(
            page, documents=page.documents + more.documents, skipped=skipped, rows_read=rows_read
        )

    def _search(
        self, request: SearchRequest, principal: Principal, project: str | None, prefer_index: bool
    ) -> Page:
        request = scope(request, principal, project)
        if not principal.is_admin:
            project = principal.project_id
        if request.limit < 1:
            return Page([], "none", "limit is 0")
        path, reason, probe = (
            self.choose() if prefer_index else ("fanout", "fan-out requested", False)
        )
        # After choose(), which may have refreshed the floor; the same on both paths.
        request = without_purged(request, self.purge_floor)
        why = "index" if path == "index" else reason.split(":", 1)[0]
        if path == "index":
            page = self._from_index(request, reason, None if principal.is_admin else project, probe)
            if isinstance(page, Page):
                return page
            reason, why = page
        result = self.fanout.search(request, self.cells_for(project))
        self.metrics.paths.labels("fanout", why[:60]).inc()
        return Page(result.documents, "fanout", reason, result.skipped, result.rows_read)

    def _from_index(
        self, request: SearchRequest, reason: str, project: str | None, probe: bool
    ) -> Page | tuple[str, str]:
        """The index's page, or why the cells answer instead (reason, its metric label).
        The search holds an admission slot (``index_admission``); what follows a
        timeout does not, so a member's costly searches hold theirs no longer."""
        try:
            with self.admission.admitted(project):
                stored = self.engine.search("instance", request)
        except Saturated:
            if probe:
                self.safe_connect.release_probe()
            raise
        except EngineTimeout as exc:
            answers = self.yardstick.answers()
            if answers is None:
                self.safe_connect.failed(exc)
                reason, why = f"index failed, answered from the cells: {exc}", "index failed"
            else:
                if answers:
                    # This query's own cost; a probe that met it found the engine well.
                    self.safe_connect.succeeded(searched=False)
                else:
                    # Ordinary searches are slow too: the engine is, not this query.
                    self.safe_connect.slow(exc)
                reason, why = f"index search slow, answered from the cells: {exc}", "index slow"
        except EngineError as exc:
            self.safe_connect.failed(exc)
            reason, why = f"index failed, answered from the cells: {exc}", "index failed"
        except Exception as exc:
            # Not the engine's failure but ours (a query it cannot take): answer
            # from the cells without flagging the index; counted, and logged with
            # its traceback once per kind.
            self.metrics.bug("index search", exc, log)
            if probe:
                self.safe_connect.release_probe()
            why = f"index search error ({type(exc).__name__})"
            reason = f"{why}, answered from the cells"
        else:
            self.safe_connect.succeeded()
            self.metrics.paths.labels("index", "index").inc()
            return Page([comparable(s.document) for s in stored], "index", reason)
        return reason, why

    def marker_values(
        self, marker: str, order: tuple[SortKey, ...], principal: Principal
    ) -> tuple[Scalar, ...]:
        """A marker's sort values in ``order``, read from its cell (both paths use
        these); a 400 for an unknown marker or one ``principal`` may not see."""
        return sort_values(marker_document(self.registry, self.fanout, marker, principal), order)

    def cells_for(self, project: str | None) -> list[CellMapping]:
        """Every cell, as Nova by default; with ``per_project_cells``, for one project
        only the cells its instance mappings name."""
        try:
            cells = self.registry.list_cells()
            if project is None or not self.per_project_cells:
                return cells
            m = instance_mappings.c
            query = sa.select(m.cell_uuid).where(m.project_id == project).distinct()
            with connect(self.registry.api_engine) as conn:
                held = {row[0] for row in conn.execute(query)}
        except API_DB_FAILURES as exc:
            raise unavailable("The API database is unavailable", exc) from None
        return [c for c in cells if c.uuid in held]

    def unreachable(
        self, skipped: list[SkippedCell], project: str | None, limit: int
    ) -> list[Unreachable]:
        """Instances of cells that did not answer, from their mappings (Nova's
        minimal constructs), newest first."""
        if not skipped or limit < 1:
            return []
        m = instance_mappings.c
        query = (
            sa.select(m.instance_uuid, m.project_id, m.created_at)
            .where(
                m.cell_uuid.in_([s.uuid for s in skipped]),
                m.queued_for_delete.is_(False),
            )
            .order_by(m.created_at.desc(), m.instance_uuid)
            .limit(limit)
        )
        if project is not None:
            query = query.where(m.project_id == project)
        try:
            with connect(self.registry.api_engine) as conn:
                rows = conn.execute(query).all()
        except API_DB_FAILURES:
            log.warning("could not list the instances of unreachable cells", exc_info=True)
            return []
        return [Unreachable(r.instance_uuid, r.project_id, r.created_at) for r in rows]

    def status(self) -> dict[str, Any]:
        """What ``/healthz`` shows; never takes the one re-probe a request would."""
        if self.safe_connect.flagged:
            flag = self.safe_connect.status()
            path, reason = "fanout", f"safe-connect flag set: {flag.get('reason', '')}"
        else:
            try:
                synced = self._is_synced()
            except EngineError as exc:
                self.safe_connect.failed(exc)
                synced, path, reason = False, "fanout", f"index failed: {exc}"
            else:
                path, reason = (
                    ("index", "index synced and answering")
                    if synced
                    else ("fanout", "index not marked synced by a completed bulk sync")
                )
        return {
            "path": path,
            "reason": reason,
            "synced": self._synced,
            "engine": self.engine.distribution,
            "safe_connect": self.safe_connect.status(),
        }
