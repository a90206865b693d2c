"""The embedded index's secondary indexes: each a live write pays for, so the layout is
chosen for write cost too (``sqlite_schema``). An index made by an earlier layout is
brought to the current one at its first write; a cell's versions come out in id order
from an index that holds them in insertion order, reading the cell a bounded number of
times; a project's listing walks its index newest first."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.base import WriteOp, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_scans import CELL_SCAN_PASSES
from cellsight.indexer.engines.sqlite_schema import (
    INDEXED_COLUMNS,
    SCHEMAS,
    cell_scan_index,
    quote,
)
from cellsight.notifications.base import format_timestamp
from cellsight.query.tree import Compare, Direction, Op, SearchRequest, SortKey

CELLS = [str(uuid.UUID(int=c + 1)) for c in range(3)]
# The secondary indexes of the layout before this one (``sqlite_schema`` says why it went).
OLD_LAYOUT = [
    ("cell_uuid", "id", "version"),
    ("created_at", "id"),
    ("tenant_id", "created_at", "id"),
    ("updated_at", "id"),
    ("user_id",),
    ("host",),
    ("node",),
    ("state", "created_at", "id"),
    ("display_name",),
]


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


def current() -> set[str]:
    return {"_".join(cols) for cols in INDEXED_COLUMNS["instance"]}


@pytest.fixture
def engine(tmp_path: Path) -> EmbeddedEngine:
    eng = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    eng.ensure_ready("instance")
    return eng


def old_layout(engine: EmbeddedEngine, index: str) -> None:
    conn = engine._conn()
    for name in secondary(engine, index):
        conn.execute(f"DROP INDEX {quote(f'{index}#{name}')}")
    for cols in OLD_LAYOUT:
        columns = ", ".join(quote(c) for c in cols)
        conn.execute(
            f"CREATE INDEX {quote(index + '#' + '_'.join(cols))} ON {quote(index)} ({columns})"
        )
    assert secondary(engine, index) == {"_".join(cols) for cols in OLD_LAYOUT}


def statistics(engine: EmbeddedEngine, index: str) -> set[str]:
    rows = engine._conn().execute("SELECT idx FROM sqlite_stat1 WHERE tbl = ?", (index,))
    return {name.removeprefix(f"{index}#") for (name,) in rows if name}


def test_an_index_of_the_earlier_layout_gets_this_one_at_its_first_write(
    engine: EmbeddedEngine,
) -> None:
    index = engine.indexes("instance")[0].name
    conn = engine._conn()
    old_layout(engine, index)
    ops = instances(30)
    # A process of this version, as after an upgrade: its first write migrates.
    upgraded = EmbeddedEngine(engine.path, prefix="t")
    assert all(r.status is WriteStatus.OK for r in upgraded.bulk(ops))
    assert secondary(upgraded, index) == current()
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # The rows written before and after are all in the new indexes.
    for cell in CELLS:
        expected = sorted((op.id, op.version) for op in ops if op.document["cell_uuid"] == cell)
        assert list(upgraded.iter_versions("instance", cell, 4)) == expected


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
    assert not statistics(upgraded, index) & {"_".join(cols) for cols in OLD_LAYOUT} - current()


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
    # 200 documents with a batch size of 1: pages of 200 / CELL_SCAN_PASSES, and the last
    # one, short, says the end.
    assert len(pages) <= CELL_SCAN_PASSES + 1
    assert all(f"INDEXED BY {quote(cell_scan_index(index))}" in s for s in pages)
    plan = engine._conn().execute(f"EXPLAIN QUERY PLAN {pages[0]}").fetchall()
    assert any("COVERING INDEX" in row[3] for row in plan)  # never the table's rows


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
