"""The embedded engine's own promises, beyond the shared contract: its table layout
(sortable dates, side rows), the strict checks, durability, concurrent use, and the
query plans its searches get."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.documents import event_version, instance_document
from cellsight.indexer.engines import sqlite_search
from cellsight.indexer.engines.base import EngineUnavailable, WriteOp, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_rows import InvalidDocument, RowBuilder
from cellsight.indexer.engines.sqlite_schema import SCHEMAS, date_to_micros, micros_to_date
from cellsight.indexer.fields import field_map
from cellsight.notifications.base import format_timestamp
from cellsight.notifications.envelope import decode
from cellsight.notifications.payloads import InstancePayload
from cellsight.query.prepare import keyset, prepare
from cellsight.query.tree import (
    And,
    Compare,
    Direction,
    MatchAll,
    Op,
    Regex,
    SearchRequest,
    SortKey,
)

ROOT = Path(__file__).resolve().parents[2]


def op(doc_id: str, version: int, **fields: Any) -> WriteOp:
    return WriteOp("instance", doc_id, version, {"uuid": doc_id, "version": version, **fields})


@pytest.fixture
def engine(tmp_path: Path) -> EmbeddedEngine:
    eng = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    eng.ensure_ready("instance")
    return eng


def sql(engine: EmbeddedEngine, query: str, *params: Any) -> list[Any]:
    table = engine.indexes("instance")[0].name
    return engine._conn().execute(query.replace("{t}", table), params).fetchall()


def test_dates_sort_by_instant_whatever_their_written_form(engine: EmbeddedEngine) -> None:
    # As text, "...11Z" sorts after "...11.5Z" and an offset sorts by its local time.
    forms = {
        "a": "2012-10-29T13:42:11.500000Z",
        "b": "2012-10-29T13:42:11Z",
        "c": "2012-10-29T15:42:12+02:00",
        "d": "2012-10-29T13:42:11.000001Z",
    }
    engine.bulk([op(k, 1, created_at=v) for k, v in forms.items()])
    rows = sql(engine, 'SELECT id, created_at FROM "{t}" ORDER BY created_at')
    assert [r[0] for r in rows] == ["b", "d", "a", "c"]
    assert micros_to_date(rows[0][1]) == "2012-10-29T13:42:11Z"
    assert micros_to_date(rows[2][1]) == "2012-10-29T13:42:11.500000Z"
    assert date_to_micros("1969-12-31T23:59:59.999999Z") == -1
    stored = engine.get("instance", "c")
    assert stored is not None and stored.document["created_at"] == forms["c"]  # as written


def test_multi_valued_fields_are_side_rows_replaced_with_the_document(
    engine: EmbeddedEngine,
) -> None:
    engine.bulk([op("x", 1, tags=["a", "b"], ip4=["10.0.0.1"]), op("y", 1, tags=["b"])])
    engine.bulk([op("x", 2, tags=["c"])])
    name = engine.indexes("instance")[0].name
    rows = (
        engine._conn()
        .execute(
            f'SELECT t.id, m.field, m.value FROM "{name}#many" m JOIN "{name}" t USING (rid) '
            "ORDER BY 1, 2, 3"
        )
        .fetchall()
    )
    assert rows == [("x", "tags", "c"), ("y", "tags", "b")]
    assert engine.delete("instance", ["y"]) == 1
    assert engine._conn().execute(f'SELECT count(*) FROM "{name}#many"').fetchone() == (1,)


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("flavor_memory_mb", 512.0, True),  # an integral number, as Elasticsearch takes it
        ("flavor_memory_mb", 512.5, False),
        ("flavor_memory_mb", True, False),
        ("flavor_memory_mb", 2**63, False),
        ("flavor_rxtx_factor", 2, True),
        ("flavor_rxtx_factor", float("nan"), False),
        ("locked", "true", False),
        ("created_at", "yesterday", False),
        ("tags", "solo", True),  # one value for a list field
        ("tags", ["a", 1], False),
        ("host", ["a", "b"], False),  # a column holds one value
        ("metadata", {"k": "v"}, True),
        ("metadata", "flat", False),
        ("ip_addresses", {"address": "10.0.0.1"}, False),
    ],
)
def test_values_are_checked_against_the_field_kind(field: str, value: Any, accepted: bool) -> None:
    builder = RowBuilder(SCHEMAS["instance"])
    if accepted:
        builder.prepare(op("x", 1, **{field: value}))
    else:
        with pytest.raises(InvalidDocument, match=rf"\[{field}\]"):
            builder.prepare(op("x", 1, **{field: value}))


def test_the_fast_path_builds_what_the_checked_path_builds(nova_like_dir: Path) -> None:
    builder = RowBuilder(SCHEMAS["instance"])
    for path in sorted(nova_like_dir.glob("instance-*.json")):
        n = decode(json.loads(path.read_text()))
        assert isinstance(n.payload, InstancePayload)
        version = event_version(n.payload, n.event, n.timestamp)
        doc = instance_document(n.payload, n.event_type, version, cell_uuid=str(uuid.uuid4()))
        fast = builder.prepare(WriteOp("instance", doc["uuid"], version, doc))
        checked = builder._checked(fast.op)
        assert (fast.row, fast.doc) == (checked.row, checked.doc), path.name
        assert sorted(fast.side) == sorted(checked.side), path.name


def test_unstorable_values_reject_only_their_document(engine: EmbeddedEngine) -> None:
    results = engine.bulk(
        [
            op("a", 1),
            op("b", 1, host="\ud800"),  # a lone surrogate: not UTF-8, sqlite3 cannot bind it
            op("c", 1, metadata={"k": object()}),  # not JSON
            op("d", 1),
        ]
    )
    ok, rejected = WriteStatus.OK, WriteStatus.REJECTED
    assert [r.status for r in results] == [ok, rejected, rejected, ok]
    assert "JSON" in (results[2].reason or "")
    assert engine.count("instance") == 2


def test_secondary_indexes_wait_for_the_end_of_a_bulk_load(engine: EmbeddedEngine) -> None:
    engine.create_index("instance", "t-instance-load", bulk_load=True)

    def indexes() -> set[str]:
        rows = engine._conn().execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
            ("t-instance-load",),
        )
        return {name for (name,) in rows if not name.startswith("sqlite_autoindex")}

    assert indexes() == set()
    list(engine.bulk_index("t-instance-load", iter([op("a", 1, created_at="2020-01-01")])))
    engine.finish_bulk_load("t-instance-load")
    assert "t-instance-load#created_at" in indexes()
    info = {i.name: i for i in engine.indexes("instance")}["t-instance-load"]
    assert info.meta["bulk_load"] is False and info.docs == 1


def test_the_file_is_durable_and_in_wal_mode(tmp_path: Path) -> None:
    first = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    first.ensure_ready("instance")
    first.bulk([op("a", 3)])
    first.put_meta("synced:instance", {"at": 1})
    first.close()
    again = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    stored = again.get("instance", "a")
    assert stored is not None and stored.version == 3
    assert again.get_meta("synced:instance") == {"at": 1}
    assert again._conn().execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert EmbeddedEngine(tmp_path / "index.db", prefix="other").get_meta("synced:instance") is None


def test_a_field_added_to_the_registry_gets_its_column(engine: EmbeddedEngine) -> None:
    name = engine.indexes("instance")[0].name
    engine._conn().execute(f'ALTER TABLE "{name}" DROP COLUMN key_name')  # an older layout
    fresh = EmbeddedEngine(engine.path, prefix="t")
    assert [r.status for r in fresh.bulk([op("a", 1, key_name="k")])] == [WriteStatus.OK]
    assert sql(fresh, 'SELECT key_name FROM "{t}"') == [("k",)]


def test_concurrent_ensure_ready_makes_one_index(tmp_path: Path) -> None:
    engines = [EmbeddedEngine(tmp_path / "index.db", prefix="t") for _ in range(4)]
    barrier = threading.Barrier(len(engines))

    def ready(eng: EmbeddedEngine) -> None:
        barrier.wait()
        eng.ensure_ready("instance")

    with ThreadPoolExecutor(len(engines)) as pool:
        list(pool.map(ready, engines))
    assert len(engines[0].indexes("instance")) == 1


WRITER = """
import sys
from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
eng = EmbeddedEngine(sys.argv[1], prefix="t")
for batch in range(40):
    ops = [WriteOp("instance", f"{batch:03}-{i:03}", 1, {"uuid": f"{batch:03}-{i:03}"})
           for i in range(50)]
    assert all(r.status.value == "ok" for r in eng.bulk(ops))
"""


def test_threads_read_while_another_process_writes(engine: EmbeddedEngine) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(engine.path)], cwd=ROOT)

    def read(_: int) -> list[int]:
        seen = []
        while writer.poll() is None:
            n = engine.count("instance")
            assert sum(1 for _ in engine.iter_versions("instance", batch_size=97)) >= n
            seen.append(n)
        return seen

    with ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(read, range(4)))
    assert writer.wait(timeout=60) == 0
    assert engine.count("instance") == 2000
    for counts in seen:  # each reader saw whole batches, never going back
        assert counts == sorted(counts) and all(n % 50 == 0 for n in counts)
    assert any(0 < n < 2000 for counts in seen for n in counts)  # they did overlap


# Plans ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEngine]:
    """4000 instances loaded as bulk sync loads them (indexes built, then analyzed):
    three quarters active and seven other states, names in another order than creation,
    100 hosts."""
    eng = EmbeddedEngine(tmp_path_factory.mktemp("skewed") / "index.db", prefix="t")
    eng.create_index("instance", "t-instance-skewed", bulk_load=True)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    ops = [
        op(
            f"{i:05}",
            1,
            state="active" if i % 4 else f"state-{i // 4 % 7}",
            host=f"h{i % 100}",
            display_name=f"n{i * 7919 % 4000:05}",
            created_at=format_timestamp(start + timedelta(seconds=i, microseconds=i)),
            deleted=False,
        )
        for i in range(4000)
    ]
    assert all(r.status is WriteStatus.OK for r in eng.bulk_index("t-instance-skewed", iter(ops)))
    eng.finish_bulk_load("t-instance-skewed")
    eng.set_aliases("instance", read="t-instance-skewed", write=["t-instance-skewed"])
    yield eng
    eng.close()


def plan(engine: EmbeddedEngine, request: SearchRequest) -> list[str]:
    node, order = prepare(request, field_map("instance"))
    index = "t-instance-skewed"
    query, params = sqlite_search._page_sql(SCHEMAS["instance"], index, node, order, request.limit)
    rows = engine._conn().execute(f"EXPLAIN QUERY PLAN {query}", params)
    return [row[3].replace(index, "T") for row in rows]


NEWEST = (SortKey("created_at", Direction.DESC),)
ACTIVE = Compare("state", Op.EQ, "active")


def test_analyze_counts_every_row(skewed: EmbeddedEngine) -> None:
    # A sampled ANALYZE saw one state in the first rows of its index: "~1000 rows each"
    stats = dict(skewed._conn().execute("SELECT idx, stat FROM sqlite_stat1"))
    assert stats["t-instance-skewed#state_created_at"].split()[:2] == ["4000", "500"]


def test_keyset_pages_seek_the_sort_index(skewed: EmbeddedEngine) -> None:
    first = skewed.search("instance", SearchRequest(MatchAll(), NEWEST, 100))
    marker = keyset((*NEWEST, SortKey("uuid")), first[-1].document)
    request = SearchRequest(MatchAll(), NEWEST, 100, marker)
    assert plan(skewed, request) == [
        "SEARCH T USING INDEX T#created_at (created_at<?)",
        "USE TEMP B-TREE FOR RIGHT PART OF ORDER BY",
    ]
    second = skewed.search("instance", request)
    assert [d.id for d in second] == [f"{i:05}" for i in range(3899, 3799, -1)]


def test_a_common_state_walks_its_index_in_the_default_order(skewed: EmbeddedEngine) -> None:
    assert plan(skewed, SearchRequest(ACTIVE, NEWEST, 10)) == [
        "SEARCH T USING INDEX T#state_created_at (state=?)",
        "USE TEMP B-TREE FOR RIGHT PART OF ORDER BY",
    ]


def walks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each ordered walk tried since finished within its budget."""
    seen: list[bool] = []
    within = sqlite_search._within

    def spy(*args: Any) -> Any:
        rows = within(*args)
        seen.append(rows is not None)
        return rows

    monkeypatch.setattr(sqlite_search, "_within", spy)
    return seen


def test_a_common_value_is_found_by_walking_the_sort_index(
    skewed: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner reads every active row through the state index and sorts them by
    name; the walk of the name index finds ten in about thirteen rows."""
    by_name = SearchRequest(ACTIVE, (SortKey("display_name"),), 10)
    assert "USE TEMP B-TREE FOR ORDER BY" in plan(skewed, by_name)
    seen = walks(monkeypatch)
    walked = skewed.search("instance", by_name)
    assert seen == [True]
    monkeypatch.setattr(sqlite_search, "WALK_ROWS_PER_RESULT", 10**9)  # the planner's plan
    assert [d.id for d in skewed.search("instance", by_name)] == [d.id for d in walked]
    assert seen == [True]
    assert [d.document["display_name"] for d in walked] == sorted(
        d.document["display_name"] for d in walked
    )


def test_a_selective_filter_is_left_to_the_planner(
    skewed: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = walks(monkeypatch)
    by_name = SearchRequest(Compare("host", Op.EQ, "h7"), (SortKey("display_name"),), 10)
    assert len(skewed.search("instance", by_name)) == 10
    assert seen == []  # 40 rows a host: fewer than WALK_ROWS_PER_RESULT per result


def test_a_walk_past_its_budget_leaves_the_page_to_the_planner(
    skewed: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = walks(monkeypatch)
    monkeypatch.setattr(sqlite_search, "WALK_BUDGET_S", 0.0)
    nowhere = And((ACTIVE, Regex("display_name", "^none")))
    assert skewed.search("instance", SearchRequest(nowhere, (SortKey("display_name"),), 10)) == []
    sevens = SearchRequest(
        And((ACTIVE, Regex("display_name", "7$"))), (SortKey("display_name"),), 20
    )
    cut = skewed.search("instance", sevens)
    assert seen == [False, False]
    monkeypatch.setattr(sqlite_search, "WALK_BUDGET_S", 60.0)
    assert [d.id for d in skewed.search("instance", sevens)] == [d.id for d in cut]
    assert seen == [False, False, True] and len(cut) == 20
    skewed.search_timeout = 0.0  # the search's own deadline still ends it
    try:
        with pytest.raises(EngineUnavailable, match="ran past"):
            skewed.search("instance", sevens)
    finally:
        skewed.search_timeout = 10.0


MULTI_OR = [
    "MULTI-INDEX OR",
    "INDEX 1",
    "SEARCH T USING INDEX T#c (c=?)",
    "INDEX 2",
    "SEARCH T USING INDEX T#a_b (a=?)",
]


@pytest.mark.parametrize(
    ("plan_", "rows"),
    [
        (["SEARCH T USING INDEX T#a_b (a=? AND b=?)", "USE TEMP B-TREE FOR ORDER BY"], 2),
        (["SEARCH T USING INDEX T#a_b (a=? AND b>?)"], 25),  # a range keeps a quarter
        (["SEARCH T USING COVERING INDEX T#c (c=?)"], 10),
        (MULTI_OR, 110),
        (["SCAN T"], 1000),
        (["SEARCH T USING INTEGER PRIMARY KEY (rowid=?)", "SEARCH m USING PRIMARY KEY (rid=?)"], 0),
        (["SEARCH T USING INDEX T#unknown (x=?)"], None),
    ],
)
def test_plans_are_costed_from_the_statistics(plan_: list[str], rows: float | None) -> None:
    stats = {"T#a_b": "1000 100 2", "T#c": "1000 10"}
    assert sqlite_search._rows_read(plan_, "T", stats) == rows
