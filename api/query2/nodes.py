"""Node queries: the node state cache (``cellsight.api.query2.node_cache``), filled from
the index or cells.

A snapshot of the cells the cache misses (``load_cells``) reads the index's node
documents when the node index is marked synced by a completed bulk sync and the
safe-connect flag is clear (an index failure sets it, as for instances): one search for
all those cells. Otherwise it reads each cell's ``compute_nodes`` table through the
fan-out pool, one SELECT per cell, each row as the very document bulk sync writes for
it (``cellsight.indexer.row_documents``). Queries then filter the cached documents in memory
(``evaluate``), with the filter tree's semantics, so both sources answer alike.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from starlette.datastructures import State

from cellsight.api.fanout import FanOut
from cellsight.api.query2.evaluate import Deadline, evaluate
from cellsight.api.query2.node_cache import CellLoad, NodeCache, NodeSnapshot
from cellsight.api.query2.rows import NODE_LIVE
from cellsight.api.safe_connect import SafeConnect
from cellsight.cells.mappings import CellMapping
from cellsight.cells.reads import list_compute_nodes
from cellsight.indexer.documents import comparable
from cellsight.indexer.engines.base import EngineError, SearchEngine
from cellsight.indexer.index_roles import is_synced
from cellsight.indexer.row_documents import node_row_document
from cellsight.query.tree import In, Node, SearchRequest, SortKey

log = logging.getLogger(__name__)

PAGE = 1000
_lock = threading.Lock()


def node_cache(state: State) -> NodeCache:
    """The app's node cache, made on first use (the app factory is not ours to extend)."""
    cache: NodeCache | None = getattr(state, "node_cache", None)
    if cache is None:
        with _lock:
            cache = getattr(state, "node_cache", None)
            if cache is None:
                cache = NodeCache(
                    lambda: state.registry.list_cells(),
                    lambda cells: load_cells(state, cells),
                    ttl=state.settings.node_cache_ttl,
                    truth=lambda cells: load_truth(state, cells),
                )
                state.node_cache = cache
                if state.settings.node_cache_refresh > 0:
                    _start_refresh(cache, state.settings.node_cache_refresh)
                if state.settings.node_cache_listen:
                    from cellsight.api.node_listener import start_listener

                    state.node_listener = start_listener(state.settings, cache)
    return cache


def _start_refresh(cache: NodeCache, interval: float) -> None:
    """Refill every entry every ``interval`` seconds, so requests rarely miss."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval):
            try:
                cache.warm()
            except Exception:
                log.warning("periodic node cache refresh failed", exc_info=True)

    threading.Thread(target=run, name="node-cache-refresh", daemon=True).start()


def load_cells(state: State, cells: Sequence[CellMapping]) -> CellLoad:
    """One snapshot of ``cells``: a single index search, or one SELECT per cell."""
    engine: SearchEngine = state.engine
    safe: SafeConnect = state.safe_connect
    use, probe = safe.try_index()
    if use:
        try:
            if is_synced(engine, "node"):
                documents = _from_index(engine, [c.uuid for c in cells])
                safe.succeeded()
                names = {c.uuid: c.name for c in cells}
                by_cell: dict[str, list[dict[str, Any]]] = {c.uuid: [] for c in cells}
                for doc in documents:
                    cell = str(doc.get("cell_uuid"))
                    by_cell.setdefault(cell, []).append(with_derived(doc, names.get(cell)))
                return CellLoad(by_cell, (), "index")
            if probe:  # another request's probe role is not this one's to end
                safe.release_probe()
        except EngineError as exc:
            safe.failed(exc)
        except Exception as exc:
            # Our failure, not the engine's (a query it cannot take): answer from the
            # cells without flagging the index, as the instance search does; counted,
            # and logged with its traceback once per kind.
            state.metrics.bug("node index read", exc, log)
            if probe:
                safe.release_probe()
    return _from_cells(list(cells), state.fanout)


def load_truth(state: State, cells: Sequence[CellMapping]) -> CellLoad:
    """Cells an event or an operation dropped entries of: read from their databases,
    since the index may not hold the change yet. A cell that does not answer is read as
    any other (from the index, when it serves), rather than left out, and named in
    ``unanswered`` (a refresh reports it)."""
    load = _from_cells(list(cells), state.fanout)
    if not load.skipped or state.safe_connect.flagged:
        return load
    try:  # never the cells a second time: only the index is worth asking now
        if not is_synced(state.engine, "node"):
            return load
    except EngineError:
        return load
    missed = {s.uuid for s in load.skipped}
    rest = load_cells(state, [c for c in cells if c.uuid in missed])
    neither = {s.uuid for s in rest.skipped}
    unanswered = tuple(s for s in load.skipped if s.uuid not in neither)
    documents = {**load.documents, **rest.documents}
    if rest.source != "index":  # the cells again: the index was not asked after all
        return CellLoad(documents, rest.skipped, rest.source)
    return CellLoad(documents, rest.skipped, "cells", unanswered)


def with_derived(doc: dict[str, Any], cell_name: str | None) -> dict[str, Any]:
    """``doc`` with the node fields no document stores (``fields.COMPUTED["node"]``)."""
    total, used = doc.get("memory_mb"), doc.get("memory_mb_used")
    doc["name"] = doc.get("hypervisor_hostname")
    doc["cell"] = cell_name
    doc["memory_mb_free"] = (
        max(0, total - used) if isinstance(total, int) and isinstance(used, int) else None
    )
    return doc


def _from_index(engine: SearchEngine, cells: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after: tuple[Any, ...] | None = None
    where = In("cell_uuid", tuple(cells))
    while True:
        page = engine.search("node", SearchRequest(where, (SortKey("uuid"),), PAGE, after))
        out.extend(comparable(s.document) for s in page)
        if len(page) < PAGE:
            return out
        after = (page[-1].document["uuid"],)


def _from_cells(cells: list[CellMapping], fanout: FanOut) -> CellLoad:
    def read(cell: CellMapping, conn: Any) -> list[dict[str, Any]]:
        return [
            with_derived(comparable(node_row_document(row, cell.uuid)), cell.name)
            for row in list_compute_nodes(conn)
        ]

    results = fanout.map_cells(cells, read)
    return CellLoad(dict(results.results), tuple(results.skipped), "cells")


MEMO_LIMIT = 256  # distinct filters remembered per snapshot


def vouched(snapshot: NodeSnapshot, doc: Mapping[str, Any]) -> Collection[str] | None:
    """The fields whose values an answer shows for ``doc`` (None: all of them). A node of
    a cell that did not answer (status 2) or an offline one (status 4) shows no live
    figures, so no filter selects it by them: a condition on one is unknown, as for the
    instances of a skipped cell."""
    if doc.get("offline") or snapshot.stale(doc):
        return doc.keys() - NODE_LIVE
    return None


def _matches(snapshot: NodeSnapshot, tree: Node, doc: Mapping[str, Any]) -> bool:
    return evaluate(tree, doc, vouched(snapshot, doc)) is True


def select(snapshot: NodeSnapshot, tree: Node, deadline: Deadline) -> list[dict[str, Any]]:
    """The cached node documents ``tree`` matches, in uuid order; ``EvaluationDeadline``
    once ``deadline`` is past.

    Remembered per snapshot: the snapshot is immutable, so a repeated query on a warm
    cache costs a dictionary lookup, not an evaluation of every node."""
    memo = snapshot.selections
    try:
        chosen = memo.get(tree)
        remember = True
    except TypeError:  # a tree holding an unhashable value: evaluate, do not remember
        chosen, remember = None, False
    if chosen is None:
        chosen = []
        for doc in snapshot.documents:
            deadline.check()
            if _matches(snapshot, tree, doc):
                chosen.append(doc)
        if remember and len(memo) < MEMO_LIMIT:
            memo[tree] = chosen
    return [dict(d) for d in chosen]
