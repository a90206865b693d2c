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


def _two_nodes(clock: ManualClock) -> tuple[NodeCache, dict[str, Any], dict[str, Any]]:
    """A cache over one cell of two nodes, n1 and n2, in its index and its database."""
    cell = CellMapping("c1", "c1", "sqlite://")
    nodes = {n: {"uuid": n, "cell_uuid": "c1", "version": 5} for n in ("n1", "n2")}
    index, db = dict(nodes), dict(nodes)
    cache = NodeCache(
        lambda: [cell],
        lambda cells: CellLoad({"c1": [dict(d) for d in index.values()]}, (), "index"),
        truth=lambda cells: CellLoad({"c1": [dict(d) for d in db.values()]}, (), "cells"),
        clock=clock,
    )
    return cache, index, db


def test_a_node_deleted_after_a_bypass_is_not_kept_over_the_index() -> None:
    """A review: a bypass (or ``nodes refresh``) read every node from its cell, and each
    then stood over the index for a TTL, so a node deleted since stayed listed ten
    minutes where the index no longer had it; before the bypass read the cells, it went
    at the next read."""
    for first_read_bypasses in (True, False):
        clock = ManualClock()
        cache, index, db = _two_nodes(clock)
        if not first_read_bypasses:
            cache.get()  # read from the index first, then bypassed
        cache.get(bypass=True)
        del db["n2"], index["n2"]  # deleted; its document removed (no listener here)
        clock.now += 60
        assert [d["uuid"] for d in cache.warm().documents] == ["n1"], first_read_bypasses


def test_what_a_bypass_finds_newer_than_the_cache_still_outlives_a_lagging_index() -> None:
    clock = ManualClock()
    cache, _index, db = _two_nodes(clock)
    cache.get()
    db["n2"] = {**db["n2"], "version": 6}  # changed; the index lags
    db["n3"] = {"uuid": "n3", "cell_uuid": "c1", "version": 1}  # registered; not indexed
    cache.get(bypass=True)
    clock.now += 60
    warmed = {d["uuid"]: d["version"] for d in cache.warm().documents}
    assert warmed == {"n1": 5, "n2": 6, "n3": 1}


def test_a_bypass_after_an_event_dropped_the_cache_outlives_a_lagging_index() -> None:
    """A review: a bypass stamped only what was news against the cache, and a live
    migration had emptied it, so the lagging index's older figures came back at the next
    refresh and stayed a TTL."""
    clock = ManualClock()
    cache, _index, db = _two_nodes(clock)
    cache.get()
    cache.observe("instance.live_migration.post.end", None)  # the whole cache dropped
    db["n1"] = {**db["n1"], "version": 6}  # the migration's new figures; the index lags
    assert {d["uuid"]: d["version"] for d in cache.get(bypass=True).documents}["n1"] == 6
    clock.now += 30
    assert {d["uuid"]: d["version"] for d in cache.warm().documents} == {"n1": 6, "n2": 5}
