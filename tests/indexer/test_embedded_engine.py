"""The embedded engine's own promises, beyond the shared contract: its table layout
(sortable dates, side rows), the strict checks, durability, and concurrent use."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from indexer.documents import event_version, instance_document
from indexer.engines.base import WriteOp, WriteStatus
from indexer.engines.embedded import EmbeddedEngine
from indexer.engines.sqlite_rows import InvalidDocument, RowBuilder
from indexer.engines.sqlite_schema import SCHEMAS, date_to_micros, micros_to_date
from notifications.envelope import decode
from notifications.payloads import InstancePayload

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


def test_the_fast_path_builds_what_the_checked_path_builds(samples_dir: Path) -> None:
    builder = RowBuilder(SCHEMAS["instance"])
    for path in sorted(samples_dir.glob("instance-*.json")):
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
    assert "t-instance-load#created_at_id" in indexes()
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
from indexer.engines.base import WriteOp
from indexer.engines.embedded import EmbeddedEngine
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
