"""Node queries: the node state cache, loaded from the index or the cells.

Loading: from the index's node documents when the node index is marked synced by a
completed bulk sync and the safe-connect flag is clear (an index failure sets it, as
for instances); otherwise from every cell's ``compute_nodes`` table through the fan-out
pool, each row as the very document bulk sync writes for it (``indexer.rowdocs``).
Queries then filter the cached documents in memory (``evaluate``), with the filter
tree's semantics, so both sources answer alike.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from starlette.datastructures import State

from api.fanout import FanOut
from api.node_cache import NodeCache, NodeSnapshot
from api.query2.evaluate import evaluate
from api.safe_connect import SafeConnect
from cells.mappings import CellMapping, CellRegistry
from cells.reads import list_compute_nodes
from indexer.documents import comparable
from indexer.engines.base import EngineError, SearchEngine
from indexer.layout import is_synced
from indexer.query.tree import MatchAll, Node, SearchRequest, SortKey
from indexer.rowdocs import node_row_document

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
                cache = NodeCache(lambda: load_nodes(state))
                state.node_cache = cache
    return cache


def load_nodes(state: State) -> NodeSnapshot:
    engine: SearchEngine = state.engine
    safe: SafeConnect = state.safe_connect
    if safe.use_index():
        try:
            if is_synced(engine, "node"):
                documents = _from_index(engine)
                safe.succeeded()
                return NodeSnapshot.of(documents, "index")
            safe.release_probe()
        except EngineError as exc:
            safe.failed(exc)
        except Exception:
            # Our failure, not the engine's (a query it cannot take): answer from the
            # cells without flagging the index, as the instance search does.
            log.exception("node index read failed; reading the cells")
            safe.release_probe()
    return _from_cells(state.registry, state.fanout)


def _from_index(engine: SearchEngine) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after: tuple[Any, ...] | None = None
    while True:
        page = engine.search("node", SearchRequest(MatchAll(), (SortKey("uuid"),), PAGE, after))
        out.extend(comparable(s.document) for s in page)
        if len(page) < PAGE:
            return out
        after = (page[-1].document["uuid"],)


def _from_cells(registry: CellRegistry, fanout: FanOut) -> NodeSnapshot:
    def read(cell: CellMapping, conn: Any) -> list[dict[str, Any]]:
        return [comparable(node_row_document(row, cell.uuid)) for row in list_compute_nodes(conn)]

    results = fanout.map_cells(registry.list_cells(), read)
    documents = [doc for docs in results.results.values() for doc in docs]
    documents.sort(key=lambda d: str(d["uuid"]))
    return NodeSnapshot.of(documents, "cells", tuple(results.skipped))


def select(snapshot: NodeSnapshot, tree: Node) -> list[dict[str, Any]]:
    """The cached node documents ``tree`` matches, in uuid order."""
    chosen = [dict(d) for d in snapshot.documents if evaluate(tree, d) is True]
    chosen.sort(key=lambda d: str(d["uuid"]))
    return chosen
