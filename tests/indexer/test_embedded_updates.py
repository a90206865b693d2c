"""Replacing a document in the embedded index rewrites only what changed: the columns
an update sets and, when they changed, its multi-valued rows. The result must be the
index a fresh load of the winning versions would build, row for row, index for index."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.indexer.engines.base import WriteOp, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_schema import SCHEMAS, quote, side_table
from cellsight.indexer.planning import plan
from tests.support.novagen import body, notification

ROW_NAMES = SCHEMAS["instance"].row_names


def base_ops(count: int) -> list[WriteOp]:
    return [
        p.op for p in plan([body(notification("instance.update", seed=i)) for i in range(count)])[1]
    ]


def revised(op: WriteOp, version: int, **fields: Any) -> WriteOp:
    return op._replace(version=version, document={**op.document, **fields})


def ready(path: Path) -> EmbeddedEngine:
    engine = EmbeddedEngine(path)
    engine.ensure_ready("instance")
    return engine


def index_of(engine: EmbeddedEngine) -> str:
    (info,) = engine.indexes("instance")
    return info.name


def rows(engine: EmbeddedEngine) -> list[tuple[Any, ...]]:
    columns = ", ".join(quote(n) for n in ROW_NAMES)
    sql = f"SELECT {columns} FROM {quote(index_of(engine))} ORDER BY id"
    return engine._conn().execute(sql).fetchall()


def side_rows(engine: EmbeddedEngine) -> set[tuple[str, str, str]]:
    index = index_of(engine)
    sql = (
        f"SELECT t.id, m.field, m.value FROM {side_table(index)} m "
        f"JOIN {quote(index)} t ON t.rid = m.rid"
    )
    return set(engine._conn().execute(sql).fetchall())


def statements(engine: EmbeddedEngine, ops: list[WriteOp]) -> list[str]:
    seen: list[str] = []
    conn: sqlite3.Connection = engine._conn()
    conn.set_trace_callback(seen.append)
    try:
        results = engine.bulk(ops)
    finally:
        conn.set_trace_callback(None)
    assert all(r.status is WriteStatus.OK for r in results), results
    return seen


def test_a_state_change_sets_only_the_changed_columns(tmp_path: Path) -> None:
    engine = ready(tmp_path / "index.db")
    (op,) = base_ops(1)
    engine.bulk([op])
    update = revised(op, op.version + 1, state="stopped", updated_at="2030-01-01T00:00:00Z")
    seen = statements(engine, [update])
    (sql,) = [s for s in seen if s.startswith("UPDATE")]
    # The trace shows the statement with its values bound.
    assert re.findall(r'"(\w+)" = ', sql.split(" WHERE ")[0]) == ["version", "state", "updated_at"]
    # The tags did not change: their rows and index entries are left alone.
    assert not [s for s in seen if s.startswith(("DELETE", "INSERT OR IGNORE"))]
    stored = engine.get("instance", op.id)
    assert stored is not None and stored.document["state"] == "stopped"
    assert dict(zip(ROW_NAMES, rows(engine)[0], strict=True))["state"] == "stopped"
    engine.close()


def test_changed_tags_replace_the_side_rows(tmp_path: Path) -> None:
    engine = ready(tmp_path / "index.db")
    (op,) = base_ops(1)
    engine.bulk([revised(op, op.version, tags=["a", "b"])])
    seen = statements(engine, [revised(op, op.version + 1, tags=["b", "c", "c"])])
    assert [s for s in seen if s.startswith("DELETE")]
    assert {(f, v) for _, f, v in side_rows(engine) if f == "tags"} == {
        ("tags", "b"),
        ("tags", "c"),
    }
    engine.close()


def test_a_stale_update_writes_nothing(tmp_path: Path) -> None:
    engine = ready(tmp_path / "index.db")
    (op,) = base_ops(1)
    engine.bulk([op])
    before = rows(engine)
    results = engine.bulk([revised(op, op.version - 1, state="error")])
    assert results[0].status is WriteStatus.STALE
    assert rows(engine) == before
    engine.close()


CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from(["active", "stopped", "error"]),
        "host": st.sampled_from(["compute-1", "compute-2", None]),
        "display_name": st.sampled_from(["a", "b", "c"]),
        "tags": st.lists(st.sampled_from(["x", "y", "z"]), max_size=3),
        "locked": st.booleans(),
        "progress": st.sampled_from([0, 50, 100, None]),
        "flavor_rxtx_factor": st.sampled_from([1.0, 1, 2.5, None]),
        "created_at": st.sampled_from(["2024-01-01T00:00:00Z", "2024-01-01T00:00:00.5Z"]),
    },
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), CHANGES), min_size=1, max_size=25
    ),
    cuts=st.lists(st.integers(1, 25), max_size=4),
)
def test_updates_converge_to_a_fresh_load_of_the_winners(
    tmp_path_factory: Any, writes: list[tuple[int, int, dict[str, Any]]], cuts: list[int]
) -> None:
    """Any sequence of versioned writes, in any batches, leaves the same rows, multi-valued
    rows and consistent indexes as loading only each id's winning version."""
    originals = base_ops(4)
    ops = [
        revised(originals[slot], originals[slot].version + bump, **changes)
        for slot, bump, changes in writes
    ]
    folder = tmp_path_factory.mktemp("updates")
    incremental = ready(folder / "incremental.db")
    incremental.bulk(originals)
    start = 0
    for cut in sorted({*cuts, len(ops)}):
        incremental.bulk(ops[start:cut])
        start = max(start, cut)
    winners: dict[str, WriteOp] = {op.id: op for op in originals}
    for op in ops:
        if op.version > winners[op.id].version:
            winners[op.id] = op
    fresh = ready(folder / "fresh.db")
    fresh.bulk(list(winners.values()))
    assert rows(incremental) == rows(fresh)
    assert side_rows(incremental) == side_rows(fresh)
    assert incremental._conn().execute("PRAGMA integrity_check").fetchone() == ("ok",)
    incremental.close()
    fresh.close()
