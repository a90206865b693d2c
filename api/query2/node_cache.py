"""The node state cache: per-node entries, refilled a cell at a time.

Reading a node's live state is the expensive part of a node query, so:

* **Snapshots per cell**: a miss reads a cell's nodes in one round trip (one SELECT on
  the cell, or one index search) and refills its entries; missed cells in parallel.
* **Entries per node with a TTL** (``DEFAULT_TTL``, 10 minutes; the clock injectable):
  a request is served from the cache only if every cell's node list is known and each
  of its nodes has a fresh entry; else the cells that cannot answer are snapshotted.
* **Invalidation**: a node notification (``compute_node.update``) or an operation on a
  node drops that node's entry (its cell is read again on the next request); a live
  migration, evacuation or cross-host resize drops the whole cache (``observe``). A
  cell read again for a dropped entry is read by ``truth`` when given (its own
  database): the index may not hold the change yet, and an entry refilled from it
  would keep the old state for a whole TTL.
* ``get(bypass=True)`` (``bypass_cache=true``; ``refresh()``, for ``nodes refresh``)
  reads every cell from its own database (``truth``), outside the lock, and refills; a
  cell whose database does not answer is named as skipped even when the index filled
  its entries in. ``warm()`` (the periodic refresh) reads every cell the usual way.
* A cell that does not answer keeps its old entries, shown with status 2 (no data)
  for their live fields, and is read again by the next request.

Hits, misses and invalidations are Prometheus counters (and attributes, for tests)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from cellsight.api.fanout import SkippedCell
from cellsight.cells.mappings import CellMapping
from cellsight.notifications.objects import NODE_UPDATE, ComputeNodePayload

log = logging.getLogger(__name__)

DEFAULT_TTL = 600.0
HITS = Counter("cellsight_node_cache_hits", "Node requests answered from the cache alone")
MISSES = Counter("cellsight_node_cache_misses", "Node requests that snapshotted cells")
INVALIDATIONS = Counter(
    "cellsight_node_cache_invalidations", "Entries dropped by events", ["scope"]
)
# Instance events that move load between nodes wholesale: drop everything.
WHOLE_CACHE_EVENTS = ("live_migration", "evacuate", "resize_migrat", "resize_finish")
NODE_EVENT = NODE_UPDATE
MAX_TOUCHED = 10_000  # cells counted by the events naming them (events name any uuid)


@dataclass(frozen=True)
class NodeSnapshot:
    """The node documents of one answer, where they came from, and what was missing."""

    documents: tuple[Mapping[str, Any], ...]
    source: str  # "index" or "cells"
    skipped_cells: tuple[SkippedCell, ...] = ()
    loaded_at: float = 0.0
    _offline: frozenset[tuple[str, str]] = field(default=frozenset(), repr=False)
    # filter tree → the documents it selects: a snapshot never changes, so neither do they
    selections: dict[Any, list[Mapping[str, Any]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def of(
        cls,
        documents: Sequence[Mapping[str, Any]],
        source: str,
        skipped_cells: tuple[SkippedCell, ...] = (),
        loaded_at: float = 0.0,
    ) -> NodeSnapshot:
        offline = frozenset(
            (str(d.get("host")), str(d.get("hypervisor_hostname")))
            for d in documents
            if d.get("offline")
        )
        return cls(tuple(documents), source, skipped_cells, loaded_at, offline)

    @property
    def complete(self) -> bool:
        return not self.skipped_cells

    def stale(self, doc: Mapping[str, Any]) -> bool:
        """Whether ``doc`` is an old entry of a cell that did not answer this time."""
        return any(s.uuid == doc.get("cell_uuid") for s in self.skipped_cells)

    def is_offline(self, host: str | None, node: str | None) -> bool:
        """Whether the node an instance runs on is offline (unknown nodes are not)."""
        if host is None:
            return False
        if node is not None:
            return (host, node) in self._offline
        # An instance without a node name: its host counts as offline if any node is.
        return any(h == host for h, _ in self._offline)


@dataclass
class CellLoad:
    """What one snapshot of some cells returned: documents per answering cell."""

    documents: dict[str, list[dict[str, Any]]]
    skipped: tuple[SkippedCell, ...] = ()
    source: str = "cells"
    # Cells whose database did not answer but whose documents the index gave instead.
    unanswered: tuple[SkippedCell, ...] = ()


Loader = Callable[[Sequence[CellMapping]], CellLoad]


class NodeCache:
    def __init__(
        self,
        cells: Callable[[], Sequence[CellMapping]],
        loader: Loader,
        *,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
        truth: Loader | None = None,
    ) -> None:
        if ttl < 0:
            raise ValueError("ttl must not be negative")
        self._list_cells = cells
        self._loader = loader
        self._truth_loader = truth
        self._truth: set[str] = set()  # cells whose next read goes to ``truth``
        self._read_from_cell: dict[str, float] = {}  # node uuid → when, for its entry
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._members: dict[str, list[str]] = {}  # cell uuid → its node uuids
        self._entries: dict[str, dict[str, Any]] = {}  # node uuid → document
        # Entries of a cell are loaded together: one time per cell, and the cells with
        # an entry dropped since, keep the freshness check per cell, not per node.
        self._loaded_at: dict[str, float] = {}
        self._dropped: set[str] = set()
        self._cell_of: dict[str, str] = {}
        self._generation = 0
        # Events per cell, and drops of everything: what a bypass's read may predate.
        self._touched: dict[str, int] = {}
        self._wipes = 0
        self._assembled: tuple[int, tuple[str, ...], NodeSnapshot] | None = None
        self._source = "cells"
        self.loads = 0  # snapshots taken (each of one or more cells)
        self.hits = self.misses = self.invalidations = 0

    def get(self, *, bypass: bool = False) -> NodeSnapshot:
        """The nodes of every cell; ``bypass``: each read now from its own database."""
        return self._get(every=bypass, fresh=bypass)

    def refresh(self) -> NodeSnapshot:
        return self.get(bypass=True)

    def warm(self) -> NodeSnapshot:
        """Every cell read again as a miss reads it (the periodic refresh)."""
        return self._get(every=True, fresh=False)

    def _get(self, *, every: bool, fresh: bool) -> NodeSnapshot:
        cells = list(self._list_cells())
        if fresh:
            return self._bypass(cells)
        with self._lock:  # single flight: concurrent misses share one snapshot
            # Only registered cells: node events name any uuid, kept until read (a review).
            self._truth.intersection_update(c.uuid for c in cells)
            now = self._clock()
            missing = [c for c in cells if every or not self._answers(c.uuid, now)]
            skipped: tuple[SkippedCell, ...] = ()
            if missing:
                self.misses += 1
                MISSES.inc()
                skipped = self._store(*self._read(missing, fresh=False), fresh=False)
            else:
                self.hits += 1
                HITS.inc()
            return self._assemble(cells, skipped, now)

    def _bypass(self, cells: list[CellMapping]) -> NodeSnapshot:
        """Every cell read from its own database, outside the lock: the caller asked to
        wait for the cells, the other requests did not (under the lock, a dead cell held
        every node query its ``cell_timeout``, 5 s; a review). A cell an event named
        meanwhile is read again by the next request: this read may predate the event."""
        with self._lock:
            self._truth.intersection_update(c.uuid for c in cells)
            touched, wipes = dict(self._touched), self._wipes
        read = self._read(cells, fresh=True)
        with self._lock:
            self.misses += 1
            MISSES.inc()
            skipped = self._store(*read, fresh=True)
            # Cells an event named meanwhile (any, after a whole drop): read again.
            again = {
                c.uuid
                for c in cells
                if self._wipes != wipes or self._touched.get(c.uuid) != touched.get(c.uuid)
            }
            if again:
                self._dropped.update(again & self._loaded_at.keys())
                self._truth.update(again)
                self._generation += 1
            return self._assemble(cells, skipped, self._clock())

    def _assemble(
        self, cells: list[CellMapping], skipped: tuple[SkippedCell, ...], now: float
    ) -> NodeSnapshot:
        key = tuple(c.uuid for c in cells)
        if (
            not skipped
            and self._assembled is not None
            and self._assembled[:2] == (self._generation, key)
        ):
            return self._assembled[2]
        docs = [
            self._entries[n]
            for c in cells
            for n in self._members.get(c.uuid, ())
            if n in self._entries
        ]
        docs.sort(key=lambda d: str(d["uuid"]))
        snapshot = NodeSnapshot.of(docs, self._source, skipped, now)
        self._assembled = None if skipped else (self._generation, key, snapshot)
        return snapshot

    def _answers(self, cell_uuid: str, now: float) -> bool:
        loaded = self._loaded_at.get(cell_uuid)
        return loaded is not None and cell_uuid not in self._dropped and now - loaded < self.ttl

    def _read(self, cells: list[CellMapping], fresh: bool) -> tuple[list[CellLoad], bool]:
        """The cells' loads, and whether the index stood in for no cell's own database
        where ``truth`` was asked. Keeps nothing: an exception leaves the entries as they were."""
        truth: list[CellMapping] = []
        if self._truth_loader is not None:
            truth = cells if fresh else [c for c in cells if c.uuid in self._truth]
        rest = [c for c in cells if c not in truth] if truth else cells
        loads: list[CellLoad] = []
        if self._truth_loader is not None and truth:
            try:
                loads.append(self._truth_loader(truth))
            except Exception:
                # The cells' own read failed whole (the fan-out pool full, say): those
                # cells are read as any other rather than fail every request until then.
                log.warning(
                    "node cache: reading dropped cells from their databases failed; "
                    "reading them as usual",
                    exc_info=True,
                )
                rest = cells
        if rest:
            loads.append(self._loader(rest))
        return loads, bool(truth) and rest is not cells

    def _store(
        self, loads: list[CellLoad], truth_read: bool, *, fresh: bool
    ) -> tuple[SkippedCell, ...]:
        self.loads += 1
        loaded_at = self._clock()
        for load in loads:
            self._keep(load, loaded_at, fresh)
        self._generation += 1
        if loads:  # none for no cells at all
            self._source = loads[-1].source
        if fresh and truth_read:  # an index that stood in is no answer
            return tuple(s for load in loads for s in (*load.skipped, *load.unanswered))
        return tuple(s for load in loads for s in load.skipped)

    def _keep(self, load: CellLoad, loaded_at: float, fresh: bool) -> None:
        stood_in = {s.uuid for s in load.unanswered}
        for cell_uuid, docs in load.documents.items():
            from_index = load.source == "index" or cell_uuid in stood_in
            # A bypass reads every node: only what is news to the cache (a node new to a
            # cell read before, a newer document, anything of a cell an event dropped) may
            # stand over the index a while, or a node deleted since stayed listed a TTL
            # after it (a review).
            known = cell_uuid in self._loaded_at
            dropped = not fresh or cell_uuid in self._truth
            held: dict[str, dict[str, Any]] = {}
            for old in self._members.get(cell_uuid, ()):
                entry = self._entries.pop(old, None)
                if entry is not None:
                    held[old] = entry
                self._cell_of.pop(old, None)
            incoming = {str(d["uuid"]): d for d in docs}
            kept = self._kept_over_index(held, incoming, loaded_at) if from_index else {}
            incoming.update(kept)
            for key, doc in incoming.items():
                moved_from = self._cell_of.get(key)
                if moved_from is not None and moved_from != cell_uuid:  # listed once
                    members = self._members.get(moved_from, [])
                    self._members[moved_from] = [m for m in members if m != key]
                self._entries[key] = doc
                self._cell_of[key] = cell_uuid
                if not from_index:
                    if dropped or (known and _newer(doc, held.get(key))):
                        self._read_from_cell[key] = loaded_at
                elif key not in kept:
                    self._read_from_cell.pop(key, None)
            self._members[cell_uuid] = list(incoming)
            for gone in held.keys() - incoming.keys():
                self._read_from_cell.pop(gone, None)
            # A kept entry's cell is read again a TTL after the entry was, not later.
            reads = [self._read_from_cell[k] for k in kept]
            self._loaded_at[cell_uuid] = min([loaded_at, *reads])
            self._dropped.discard(cell_uuid)
            self._truth.discard(cell_uuid)

    def _kept_over_index(
        self, held: dict[str, dict[str, Any]], incoming: dict[str, Any], now: float
    ) -> dict[str, dict[str, Any]]:
        """Entries read from their cell less than a TTL ago that the lagging index has
        not caught up with (a refresh or a bypass soon after a drop): an older document
        of the node, or none yet (a node just registered). Never longer: versions can
        go down too (a database restored, then synced again)."""
        kept = {}
        for key, before in held.items():
            read = self._read_from_cell.get(key)
            if read is None or now - read >= self.ttl:
                continue
            doc = incoming.get(key)
            if doc is None or _version(before) > _version(doc):
                kept[key] = before
        return kept

    def invalidate_node(self, node_uuid: str, cell_uuid: str | None = None) -> None:
        """Drop a node's entry. A node the cache does not hold (registered since its cell
        was read) drops its cell's freshness instead, so the next request reads it; with
        no cell to go by, every cell's."""
        with self._lock:
            named = {c for c in (cell_uuid, self._cell_of.get(node_uuid)) if c is not None}
            for cell in named:
                self._touched[cell] = self._touched.get(cell, 0) + 1
            if not named or len(self._touched) > MAX_TOUCHED:  # any uuid: bounded
                self._touched.clear()
                self._wipes += 1
            self._read_from_cell.pop(node_uuid, None)
            if self._entries.pop(node_uuid, None) is not None:
                # Its cell, and the one the event names if that differs (a node moved).
                cells = {self._cell_of[node_uuid]}
                if cell_uuid is not None and cell_uuid in self._loaded_at:
                    cells.add(cell_uuid)
                self._dropped.update(cells)
                self._truth.update(cells)
            else:
                if cell_uuid is not None and cell_uuid not in self._loaded_at:
                    # Never read yet (an API just started, a cell added since): its first
                    # read goes to its database too, or the lagging index's figures stood
                    # a TTL after this API's own reservation (a probe).
                    self._truth.add(cell_uuid)
                # Cells never read, or dropped already, are read on their next request.
                cells = {cell_uuid} if cell_uuid is not None else set(self._loaded_at)
                fresh = {c for c in cells if c in self._loaded_at and c not in self._dropped}
                if not fresh:
                    return
                self._dropped.update(fresh)
                self._truth.update(fresh)
            self._generation += 1
            self._count("node")

    def invalidate(self) -> None:
        with self._lock:
            self._wipes += 1
            self._truth.update(self._loaded_at)
            self._entries.clear()
            self._read_from_cell.clear()
            self._members.clear()
            self._loaded_at.clear()
            self._cell_of.clear()
            self._dropped.clear()
            self._generation += 1
            self._count("all")

    def observe(self, event_type: str, payload: Any) -> None:
        """Drop what a notification says changed (``payload``: its decoded object)."""
        if event_type == NODE_EVENT:
            # Another class under the node event's name (a probe sent a Selection) says
            # nothing of a node; the indexer dead-letters it. Read, it stopped the listener.
            if isinstance(payload, ComputeNodePayload):
                cell = payload.cell_uuid
                self.invalidate_node(str(payload.uuid), None if cell is None else str(cell))
        elif event_type.startswith("instance.") and any(
            marker in event_type for marker in WHOLE_CACHE_EVENTS
        ):
            self.invalidate()

    def _count(self, scope: str) -> None:
        self.invalidations += 1
        INVALIDATIONS.labels(scope).inc()


def _newer(doc: Mapping[str, Any], before: Mapping[str, Any] | None) -> bool:
    return before is None or _version(before) < _version(doc)


def _version(doc: Mapping[str, Any]) -> float:
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int | float):
        return -1
    return version
