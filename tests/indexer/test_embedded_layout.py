"""The embedded index's secondary indexes: each a live write pays for, so the layout is
chosen for write cost too (``sqlite_schema``). An index made by an earlier layout is
brought to the current one at its first write; a cell's versions come out in id order
from an index that holds them in insertion order, reading the cell a bounded number of
times; a project's listing walks its index newest first."""

from __future__ import annotations

import random
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines import sqlite_scans
from cellsight.indexer.engines.base import EngineError, IndexMissing, WriteOp, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_scans import CELL_SCAN_PASSES
from cellsight.indexer.engines.sqlite_schema import (
    INDEXED_COLUMNS,
    SCHEMAS,
    cell_scan_index,
    quote,
)
from cellsight.indexer.engines.sqlite_write import Writer
from cellsight.notifications.base import format_timestamp
from cellsight.query.tree import Compare, Direction, Op, SearchRequest, SortKey
from tests.support.layouts import EARLIER_LAYOUT, use_earlier_layout

CELLS = [str(uuid.UUID(int=c + 1)) for c in range(3)]


def instances(count: int, seed: int = 1) -> list[WriteOp]:
    """New instances in creation order with random uuids, as a live stream brings them."""
    rng = random.Random(seed)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    ops = []
    for i in range(count):
        doc_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        doc: dict[str, Any] = {
            "uuid": doc_id,
            "version": 10 + i,
            "cell_uuid": CELLS[i % len(CELLS)],
            "tenant_id": f"project-{i % 7}",
            "state": "active",
            "created_at": format_timestamp(start + timedelta(seconds=i)),
        }
        ops.append(WriteOp("instance", doc_id, 10 + i, doc))
    return ops


def secondary(engine: EmbeddedEngine, index: str) -> set[str]:
    rows = engine._conn().execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql NOT NULL",
        (index,),
    )
    return {name.removeprefix(f"{index}#") for (name,) in rows}


def current(resource: str = "instance") -> set[str]:
    return {"_".join(cols) for cols in INDEXED_COLUMNS[resource]}


def earlier(resource: str = "instance") -> set[str]:
    return {"_".join(cols) for cols in EARLIER_LAYOUT[resource]}


@pytest.fixture
def engine(tmp_path: Path) -> EmbeddedEngine:
    eng = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    eng.ensure_ready("instance")
    return eng


def old_layout(engine: EmbeddedEngine, index: str, resource: str = "instance") -> None:
    use_earlier_layout(engine._conn(), index, resource)
    assert secondary(engine, index) == earlier(resource)


def statistics(engine: EmbeddedEngine, index: str) -> set[str]:
    rows = engine._conn().execute("SELECT idx FROM sqlite_stat1 WHERE tbl = ?", (index,))
    return {name.removeprefix(f"{index}#") for (name,) in rows if name}


def test_an_index_of_the_earlier_layout_gets_this_one_at_its_first_write(
    engine: EmbeddedEngine,
) -> None:
    index = engine.indexes("instance")[0].name
    conn = engine._conn()
    before = instances(30)
    engine.bulk(before)
    old_layout(engine, index)
    conn.execute(f"CREATE INDEX operators_own ON {quote(index)} (host)")  # not ours: kept
    after = instances(30, seed=2)
    # A process of this version, as after an upgrade: its first write migrates.
    upgraded = EmbeddedEngine(engine.path, prefix="t")
    assert all(r.status is WriteStatus.OK for r in upgraded.bulk(after))
    assert secondary(upgraded, index) == current() | {"operators_own"}
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # The rows written before and after are all in the new indexes.
    for cell in CELLS:
        expected = sorted(
            (o.id, o.version) for o in before + after if o.document["cell_uuid"] == cell
        )
        assert list(upgraded.iter_versions("instance", cell, 4)) == expected


def test_a_node_index_of_the_earlier_layout_gets_this_one(engine: EmbeddedEngine) -> None:
    engine.ensure_ready("node")
    index = engine.indexes("node")[0].name
    old_layout(engine, index, "node")
    node = {"uuid": "n-1", "host": "cmp-1", "cell_uuid": CELLS[0], "version": 1}
    upgraded = EmbeddedEngine(engine.path, prefix="t")
    assert upgraded.bulk([WriteOp("node", "n-1", 1, node)])[0].status is WriteStatus.OK
    assert secondary(upgraded, index) == current("node")
    assert list(upgraded.iter_versions("node", CELLS[0], 10)) == [("n-1", 1)]


def test_a_rolled_back_first_write_leaves_the_update_to_the_next(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = engine.indexes("instance")[0].name
    old_layout(engine, index)
    upgraded = EmbeddedEngine(engine.path, prefix="t")
    upsert = Writer._upsert
    failures = [sqlite3.OperationalError("database or disk is full")]

    def fails_once(self: Writer, *args: Any) -> tuple[set[int], dict[int, int]]:
        if failures:
            raise failures.pop()
        return upsert(self, *args)

    monkeypatch.setattr(Writer, "_upsert", fails_once)
    with pytest.raises(EngineError):
        upgraded.bulk(instances(3))
    assert secondary(upgraded, index) == earlier()  # rolled back with the write
    assert all(r.status is WriteStatus.OK for r in upgraded.bulk(instances(3, seed=5)))
    assert secondary(upgraded, index) == current()


def test_the_update_runs_where_temporary_storage_cannot_move(engine: EmbeddedEngine) -> None:
    index = engine.indexes("instance")[0].name
    old_layout(engine, index)
    upgraded = EmbeddedEngine(engine.path, prefix="t")
    conn = upgraded._conn()
    # Once a connection's temporary database is open, SQLite refuses ``temp_store``
    # inside a transaction, and the update runs inside the write's.
    conn.execute("CREATE TEMP TABLE opened (a)")
    conn.execute("DROP TABLE opened")
    assert all(r.status is WriteStatus.OK for r in upgraded.bulk(instances(3)))
    assert secondary(upgraded, index) == current()
    assert conn.execute("PRAGMA temp_store").fetchone() == (2,)  # the engine's MEMORY


def test_an_analyzed_index_keeps_statistics_for_its_new_indexes(engine: EmbeddedEngine) -> None:
    index = "t-instance-analyzed"
    engine.create_index("instance", index, bulk_load=True)
    assert all(r.status is WriteStatus.OK for r in engine.bulk_index(index, iter(instances(50))))
    engine.finish_bulk_load(index)
    engine.set_aliases("instance", read=index, write=[index])
    old_layout(engine, index)
    engine._conn().execute(f"ANALYZE {quote(index)}")  # as the earlier sync left it
    assert "state_created_at_id" in statistics(engine, index)
    upgraded = EmbeddedEngine(engine.path, prefix="t")
    upgraded.bulk(instances(3, seed=2))
    # The search walks an index only with its statistics (``sqlite_search._walk_index``).
    assert statistics(upgraded, index) >= current()
    assert not statistics(upgraded, index) & earlier() - current()


def test_a_bulk_loading_index_gets_its_indexes_only_at_the_end(engine: EmbeddedEngine) -> None:
    engine.create_index("instance", "t-instance-load", bulk_load=True)
    engine.set_aliases(
        "instance",
        read=engine.indexes("instance")[0].name,
        write=[engine.indexes("instance")[0].name, "t-instance-load"],
    )
    engine.bulk(instances(5))  # a live write into the loading index too
    assert secondary(engine, "t-instance-load") == set()
    engine.finish_bulk_load("t-instance-load")
    assert secondary(engine, "t-instance-load") == current()


@pytest.mark.parametrize("loaded", ["live", "bulk"])
def test_a_cells_versions_come_in_id_order_in_a_bounded_number_of_reads(
    engine: EmbeddedEngine, loaded: str
) -> None:
    ops = instances(600)
    index = engine.indexes("instance")[0].name
    if loaded == "bulk":  # built after the load, then analyzed: the planner has statistics
        index = "t-instance-loaded"
        engine.create_index("instance", index, bulk_load=True)
        assert all(r.status is WriteStatus.OK for r in engine.bulk_index(index, iter(ops)))
        engine.finish_bulk_load(index)
    else:
        for start in range(0, len(ops), 100):
            engine.bulk(ops[start : start + 100])
    statements: list[str] = []
    engine._conn().set_trace_callback(statements.append)
    try:
        got = list(engine.iter_versions("instance", CELLS[1], 1, index=index))
    finally:
        engine._conn().set_trace_callback(None)
    assert got == sorted((op.id, op.version) for op in ops if op.document["cell_uuid"] == CELLS[1])
    pages = [s for s in statements if "ORDER BY id LIMIT" in s]
    # 200 documents with a batch size of 1: pages of 200 / CELL_SCAN_PASSES + 1, the last
    # one short, which says the end.
    assert len(pages) <= CELL_SCAN_PASSES
    assert all(f"INDEXED BY {quote(cell_scan_index(index))}" in s for s in pages)
    plan = engine._conn().execute(f"EXPLAIN QUERY PLAN {pages[0]}").fetchall()
    assert any("COVERING INDEX" in row[3] for row in plan)  # never the table's rows


def test_a_large_cells_pages_stop_growing(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_scans, "CELL_PAGE_MAX", 12)  # under 200 // 8 + 1
    ops = instances(600)
    for start in range(0, len(ops), 100):
        engine.bulk(ops[start : start + 100])
    statements: list[str] = []
    engine._conn().set_trace_callback(statements.append)
    try:
        got = list(engine.iter_versions("instance", CELLS[2], 1))
    finally:
        engine._conn().set_trace_callback(None)
    assert got == sorted((op.id, op.version) for op in ops if op.document["cell_uuid"] == CELLS[2])
    limits = [int(s.rsplit("LIMIT", 1)[1]) for s in statements if "ORDER BY id LIMIT" in s]
    assert set(limits) == {12} and len(limits) == 200 // 12 + 1


def test_a_cell_scan_of_an_index_dropped_meanwhile_says_it_is_missing(
    engine: EmbeddedEngine,
) -> None:
    with pytest.raises(IndexMissing):
        list(engine._scans.versions("t-instance-gone", CELLS[0], 10))


def test_a_cell_scan_of_an_index_without_the_cell_index_still_answers(
    engine: EmbeddedEngine,
) -> None:
    ops = instances(40)
    engine.bulk(ops)
    index = engine.indexes("instance")[0].name
    engine._conn().execute(f"DROP INDEX {quote(cell_scan_index(index))}")  # a reader's view
    got = list(engine.iter_versions("instance", CELLS[0], 3))
    assert got == sorted((op.id, op.version) for op in ops if op.document["cell_uuid"] == CELLS[0])


def test_a_projects_listing_walks_its_index_newest_first(engine: EmbeddedEngine) -> None:
    ops = instances(700)
    index = "t-instance-plan"
    engine.create_index("instance", index, bulk_load=True)
    assert all(r.status is WriteStatus.OK for r in engine.bulk_index(index, iter(ops)))
    engine.finish_bulk_load(index)
    engine.set_aliases("instance", read=index, write=[index])
    request = SearchRequest(
        Compare("tenant_id", Op.EQ, "project-3"), (SortKey("created_at", Direction.DESC),), 20
    )
    statements: list[str] = []
    engine._conn().set_trace_callback(statements.append)
    try:
        page = engine.search("instance", request)
    finally:
        engine._conn().set_trace_callback(None)
    mine = [op for op in ops if op.document["tenant_id"] == "project-3"]
    assert [d.id for d in page] == [op.id for op in reversed(mine)][:20]
    (query,) = [s for s in statements if s.startswith("SELECT") and "LIMIT" in s]
    plan = [row[3] for row in engine._conn().execute(f"EXPLAIN QUERY PLAN {query}")]
    assert plan == [
        f"SEARCH {index} USING INDEX {index}#tenant_id_created_at (tenant_id=?)",
        "USE TEMP B-TREE FOR RIGHT PART OF ORDER BY",
    ]


def test_the_layout_names_only_columns_of_the_table() -> None:
    for resource, schema in SCHEMAS.items():
        for cols in INDEXED_COLUMNS[resource]:
            assert set(cols) <= {"rid", *schema.row_names}, cols
