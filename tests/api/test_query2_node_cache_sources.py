"""The node state cache's sources: an entry read from its cell against the index's
documents (which lag the operations, or go back when a cell's database is restored),
a node just registered, and one that moved cells; on an injected clock."""

from __future__ import annotations

from typing import Any

from cellsight.api.query2.node_cache import DEFAULT_TTL, CellLoad, NodeCache
from cellsight.cells.mappings import CellMapping
from tests.support.clock import ManualClock


def _index_and_cells(clock: ManualClock) -> tuple[NodeCache, dict[str, Any], dict[str, Any]]:
    """A cache over one cell whose index and database documents the test sets."""
    cell = CellMapping("c1", "c1", "sqlite://")
    index: dict[str, Any] = {"uuid": "n1", "cell_uuid": "c1", "version": 5, "offline": False}
    db = dict(index)
    cache = NodeCache(
        lambda: [cell],
        lambda cells: CellLoad({"c1": [dict(index)]}, (), "index"),
        truth=lambda cells: CellLoad({"c1": [dict(db)]}, (), "cells"),
        clock=clock,
    )
    return cache, index, db


def test_an_entry_read_from_its_cell_outlives_older_index_documents_for_a_ttl() -> None:
    clock = ManualClock()
    cache, _index, db = _index_and_cells(clock)
    cache.get()
    db.update(version=6, offline=True)
    cache.invalidate_node("n1", "c1")  # the operation; the index lags
    assert cache.get().documents[0]["offline"] is True
    clock.now += DEFAULT_TTL - 1
    assert cache.warm().documents[0]["offline"] is True  # the lagging index: kept
    loads = cache.loads
    clock.now += 1  # a TTL after the cell's read, not after the refresh that kept it
    assert cache.get().documents[0]["offline"] is False and cache.loads == loads + 1


def test_an_entry_read_from_the_index_never_outlives_a_lower_version() -> None:
    """A cell's database restored and synced again: the index's versions go down."""
    clock = ManualClock()
    cache, index, _db = _index_and_cells(clock)
    index.update(version=10)
    cache.get()
    index.update(version=3, offline=True)
    assert cache.warm().documents[0]["version"] == 3


def test_a_node_just_registered_outlives_an_index_that_lacks_it() -> None:
    clock = ManualClock()
    cell = CellMapping("c1", "c1", "sqlite://")
    n1 = {"uuid": "n1", "cell_uuid": "c1", "version": 1}
    index, db = [n1], [n1]
    cache = NodeCache(
        lambda: [cell],
        lambda cells: CellLoad({"c1": list(index)}, (), "index"),
        truth=lambda cells: CellLoad({"c1": list(db)}, (), "cells"),
        clock=clock,
    )
    cache.get()
    db.append({"uuid": "n2", "cell_uuid": "c1", "version": 1})
    cache.invalidate_node("n2", "c1")  # registered through the API; the index lags
    assert [d["uuid"] for d in cache.get().documents] == ["n1", "n2"]
    clock.now += 1
    assert [d["uuid"] for d in cache.warm().documents] == ["n1", "n2"]


def test_a_node_that_moved_cells_is_listed_once() -> None:
    """Keyed by its uuid (Nova keeps a node's uuid when it is registered again)."""
    a, b = CellMapping("a", "a", "sqlite://"), CellMapping("b", "b", "sqlite://")
    where = {"a": [{"uuid": "n1", "cell_uuid": "a", "version": 1}], "b": []}
    cache = NodeCache(
        lambda: [a, b], lambda cells: CellLoad({c.uuid: list(where[c.uuid]) for c in cells})
    )
    cache.get()
    where.update(a=[], b=[{"uuid": "n1", "cell_uuid": "b", "version": 2}])
    cache.invalidate_node("n1", "b")  # only cell b is read again
    assert [(d["uuid"], d["cell_uuid"]) for d in cache.get().documents] == [("n1", "b")]
