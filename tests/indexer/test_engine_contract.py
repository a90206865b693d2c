"""The engine contract (``cellsight.indexer.engines.base``), the same assertions for every engine.

Documents are built from the Nova samples by the real mapping code, plus small synthetic
ones. Reads are preceded by ``refresh``: osmem and the embedded index show writes at
once, but Elasticsearch only after a refresh, and the suite must hold there too.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.documents import event_version, instance_document
from cellsight.indexer.engines.base import IndexMissing, SearchEngine, WriteOp, WriteStatus
from cellsight.notifications.envelope import decode
from cellsight.notifications.payloads import InstancePayload

OK, STALE, REJECTED = WriteStatus.OK, WriteStatus.STALE, WriteStatus.REJECTED
CELL_A, CELL_B = str(uuid.uuid4()), str(uuid.uuid4())


def new_id() -> str:
    return str(uuid.uuid4())


def op(doc_id: str, version: int, **fields: Any) -> WriteOp:
    """A small synthetic instance document (ids are instance uuids, as in production)."""
    doc = {"uuid": doc_id, "display_name": f"vm-{doc_id[:8]}", "version": version, **fields}
    return WriteOp("instance", doc_id, version, doc)


def as_id(base: WriteOp, doc_id: str, version: int | None = None) -> WriteOp:
    """A sample document given another instance's id (the samples share one uuid)."""
    version = base.version if version is None else version
    doc = {**base.document, "uuid": doc_id, "version": version}
    return base._replace(id=doc_id, version=version, document=doc)


def statuses(results: Any) -> list[WriteStatus]:
    return [r.status for r in results]


@pytest.fixture(scope="module")
def nova(nova_like_dir: Path) -> dict[str, WriteOp]:
    """Instance documents from the Nova samples, by event type."""
    out = {}
    for path in sorted(nova_like_dir.glob("instance-*.json")):
        n = decode(json.loads(path.read_text()))
        assert isinstance(n.payload, InstancePayload)
        version = event_version(n.payload, n.event, n.timestamp)
        doc = instance_document(n.payload, n.event_type, version)
        out[n.event_type] = WriteOp("instance", doc["uuid"], version, doc)
    assert len(out) >= 10
    return out


@pytest.fixture
def ready(engine: SearchEngine) -> SearchEngine:
    engine.ensure_ready("instance")
    return engine


def live_index(engine: SearchEngine) -> str:
    (info,) = engine.indexes("instance")
    return info.name


def aliases(engine: SearchEngine) -> dict[str, tuple[bool, bool]]:
    """Index name → (behind the read alias, behind the write alias)."""
    return {i.name: (i.read, i.write) for i in engine.indexes("instance")}


# Lifecycle ---------------------------------------------------------------------------
def test_ensure_ready_is_idempotent_and_creates_both_aliases(engine: SearchEngine) -> None:
    engine.ensure_ready("instance")
    engine.ensure_ready("instance")
    engine.ensure_ready("node")
    (info,) = engine.indexes("instance")
    assert info.name.startswith(f"{engine.prefix}-instance-")
    assert (info.resource, info.read, info.write, info.docs) == ("instance", True, True, 0)
    (node,) = engine.indexes("node")
    assert node.name != info.name and node.read and node.write
    engine.refresh("instance")
    assert engine.count("instance") == 0
    engine.ping()


def test_missing_aliases_are_index_missing(engine: SearchEngine) -> None:
    with pytest.raises(IndexMissing):
        engine.count("instance")
    with pytest.raises(IndexMissing):
        engine.get("instance", new_id())
    with pytest.raises(IndexMissing):
        engine.bulk([op(new_id(), 1)])


# Versioned writes ----------------------------------------------------------------------
def test_bulk_then_get_returns_the_document_and_its_version(
    ready: SearchEngine, nova: dict[str, WriteOp]
) -> None:
    sample = nova["instance.create.end"]
    assert sample.version > 2**53  # a time-derived version: must survive exactly
    assert statuses(ready.bulk([sample])) == [OK]
    ready.refresh("instance")
    stored = ready.get("instance", sample.id)
    assert stored is not None
    assert (stored.id, stored.version) == (sample.id, sample.version)
    assert stored.document == sample.document
    assert ready.get("instance", new_id()) is None


def test_an_older_or_equal_version_is_stale_and_changes_nothing(ready: SearchEngine) -> None:
    doc_id = new_id()
    assert statuses(ready.bulk([op(doc_id, 10, display_name="kept")])) == [OK]
    later = ready.bulk(
        [op(doc_id, 10, display_name="same version"), op(doc_id, 9, display_name="older")]
    )
    assert statuses(later) == [STALE, STALE]
    ready.refresh("instance")
    stored = ready.get("instance", doc_id)
    assert stored is not None
    assert (stored.version, stored.document["display_name"]) == (10, "kept")


def test_a_newer_version_replaces_the_document(
    ready: SearchEngine, nova: dict[str, WriteOp]
) -> None:
    doc_id = new_id()
    create = as_id(nova["instance.create.end"], doc_id)
    # The samples share one timestamp, so their versions tie: a later state is newer.
    delete = as_id(nova["instance.delete.end"], doc_id, create.version + 1)
    assert statuses(ready.bulk([create])) == [OK]
    assert statuses(ready.bulk([delete])) == [OK]
    ready.refresh("instance")
    stored = ready.get("instance", doc_id)
    assert stored is not None
    assert stored.version == delete.version
    assert stored.document == delete.document
    assert stored.document["deleted"] is True
    assert ready.count("instance") == 1


def test_duplicates_in_one_bulk_call_converge_on_the_newest(ready: SearchEngine) -> None:
    doc_id = new_id()
    ops = [
        op(doc_id, 1, display_name="one"),
        op(doc_id, 1, display_name="one again"),
        op(doc_id, 3, display_name="three"),
        op(doc_id, 2, display_name="two"),
    ]
    assert statuses(ready.bulk(ops)) == [OK, STALE, OK, STALE]
    ready.refresh("instance")
    stored = ready.get("instance", doc_id)
    assert stored is not None
    assert (stored.version, stored.document["display_name"]) == (3, "three")
    assert ready.count("instance") == 1


def test_a_document_with_an_unknown_field_is_rejected_alone(
    ready: SearchEngine, nova: dict[str, WriteOp]
) -> None:
    good1, bad, good2 = new_id(), new_id(), new_id()
    stray = as_id(nova["instance.update"], bad)
    stray = stray._replace(document={**stray.document, "no_such_field": "x"})
    results = ready.bulk([as_id(nova["instance.create.end"], good1), stray, op(good2, 5)])
    assert statuses(results) == [OK, REJECTED, OK]
    assert results[1].reason and "no_such_field" in results[1].reason
    ready.refresh("instance")
    assert ready.get("instance", bad) is None
    assert ready.count("instance") == 2


def test_a_value_of_the_wrong_type_is_rejected_naming_the_field(ready: SearchEngine) -> None:
    doc_id = new_id()
    results = ready.bulk([op(doc_id, 1, flavor_memory_mb="plenty"), op(new_id(), 1)])
    assert statuses(results) == [REJECTED, OK]
    assert results[0].reason and "flavor_memory_mb" in results[0].reason
    ready.refresh("instance")
    assert ready.get("instance", doc_id) is None


# Reads -------------------------------------------------------------------------------
def test_get_many_returns_the_stored_ones(ready: SearchEngine, nova: dict[str, WriteOp]) -> None:
    a, b = new_id(), new_id()
    ready.bulk([as_id(nova["instance.pause.end"], a), op(b, 7)])
    ready.refresh("instance")
    found = ready.get_many("instance", [a, b, new_id()])
    assert set(found) == {a, b}
    assert found[a].version == nova["instance.pause.end"].version
    assert found[a].document == as_id(nova["instance.pause.end"], a).document
    assert (found[b].id, found[b].version, found[b].document["version"]) == (b, 7, 7)
    assert ready.get_many("instance", []) == {}


def test_get_many_with_fields_returns_those_as_stored(
    ready: SearchEngine, nova: dict[str, WriteOp]
) -> None:
    """The writer asks only for tags; a field a document lacks stays absent, a null
    stays null, nested values keep their shape. Engines may return more fields."""
    a, b, c = new_id(), new_id(), new_id()
    full = as_id(nova["instance.pause.end"], a)
    ready.bulk([full, op(b, 3, tags=["x", "y"], key_name=None), op(c, 4)])
    ready.refresh("instance")
    wanted = ("tags", "key_name", "ip_addresses", "metadata")
    found = ready.get_many("instance", [a, b, c, new_id()], fields=wanted)
    assert set(found) == {a, b, c}
    b_stored = ready.get("instance", b)
    assert b_stored is not None
    for doc_id, stored in ((a, full.document), (b, b_stored.document)):
        got = found[doc_id].document
        assert {f: got.get(f, "absent") for f in wanted} == {
            f: stored.get(f, "absent") for f in wanted
        }
    assert found[b].document["tags"] == ["x", "y"] and found[b].version == 3
    assert found[b].document["key_name"] is None
    assert "tags" not in found[c].document and found[c].version == 4
    assert isinstance(found[a].document["ip_addresses"], list)
    assert isinstance(found[a].document["metadata"], dict)


def test_count_in_total_and_per_cell(ready: SearchEngine) -> None:
    ops = [op(new_id(), 1, cell_uuid=CELL_A) for _ in range(5)]
    ops += [op(new_id(), 1, cell_uuid=CELL_B) for _ in range(3)]
    ops.append(op(new_id(), 1))  # no cell yet
    assert set(statuses(ready.bulk(ops))) == {OK}
    ready.refresh("instance")
    assert ready.count("instance") == 9
    assert ready.count("instance", CELL_A) == 5
    assert ready.count("instance", CELL_B) == 3
    assert ready.count("instance", str(uuid.uuid4())) == 0


def test_iter_versions_streams_every_id_in_order_across_batches(ready: SearchEngine) -> None:
    ops = [op(new_id(), 100 + i, cell_uuid=CELL_A if i % 3 else CELL_B) for i in range(23)]
    ready.bulk(ops)
    ready.refresh("instance")
    expected = sorted((o.id, o.version) for o in ops)
    assert list(ready.iter_versions("instance", batch_size=5)) == expected
    assert list(ready.iter_versions("instance", batch_size=23)) == expected
    in_b = sorted((o.id, o.version) for o in ops if o.document["cell_uuid"] == CELL_B)
    assert list(ready.iter_versions("instance", CELL_B, batch_size=2)) == in_b
    assert list(ready.iter_versions("instance", str(uuid.uuid4()))) == []


def test_delete_removes_documents_outright(ready: SearchEngine) -> None:
    a, b, c = new_id(), new_id(), new_id()
    ready.bulk([op(a, 1), op(b, 1), op(c, 1)])
    ready.refresh("instance")
    assert ready.delete("instance", [a, b, new_id()]) == 2
    ready.refresh("instance")
    assert ready.get("instance", a) is None and ready.get("instance", b) is None
    assert ready.get("instance", c) is not None
    assert ready.count("instance") == 1
    # Not part of the contract: whether the id can be written again, and from which
    # version (Elasticsearch keeps a tombstone at version + 1 for index.gc_deletes, the
    # embedded index keeps nothing). The writer's purge floor keeps late events out.


def test_meta_round_trip(engine: SearchEngine) -> None:
    assert engine.get_meta("synced:instance") is None
    value = {"at": "2026-01-02T03:04:05.000006Z", "cells": [CELL_A], "n": 2**60 + 1}
    engine.put_meta("synced:instance", value)
    assert engine.get_meta("synced:instance") == value
    engine.put_meta("synced:instance", {"at": None})
    assert engine.get_meta("synced:instance") == {"at": None}
    assert engine.get_meta("purge_floor:instance") is None


def test_resources_are_separate(ready: SearchEngine) -> None:
    ready.ensure_ready("node")
    node_id = new_id()
    node_doc = {"uuid": node_id, "host": "compute-1", "vcpus": 8, "cell_uuid": CELL_A}
    node = WriteOp("node", node_id, 4, {**node_doc, "version": 4})
    assert statuses(ready.bulk([node, op(new_id(), 1)])) == [OK, OK]
    ready.refresh("node")
    ready.refresh("instance")
    assert (ready.count("node"), ready.count("instance")) == (1, 1)
    stored = ready.get("node", node_id)
    assert stored is not None and stored.document == node.document
    assert ready.get("instance", node_id) is None


# Index management (bulk sync) ------------------------------------------------------------
def test_a_full_sync_swaps_the_read_alias_atomically(
    ready: SearchEngine, nova: dict[str, WriteOp]
) -> None:
    old = live_index(ready)
    live, synced = new_id(), new_id()
    ready.bulk([op(live, 5, display_name="live")])
    new = f"{ready.prefix}-instance-sync1"
    ready.create_index("instance", new, bulk_load=True)
    docs = [op(live, 5, display_name="live"), as_id(nova["instance.lock"], synced)]
    assert statuses(ready.bulk_index(new, iter(docs), chunk_size=1)) == [OK, OK]
    ready.finish_bulk_load(new)
    ready.refresh("instance")
    # Before the swap, reads see the old index only.
    assert ready.count("instance") == 1
    assert ready.get("instance", synced) is None
    assert aliases(ready) == {old: (True, True), new: (False, False)}
    assert {i.name: i.docs for i in ready.indexes("instance")} == {old: 1, new: 2}

    ready.set_aliases("instance", read=new, write=[new])
    ready.refresh("instance")
    assert ready.count("instance") == 2
    stored = ready.get("instance", synced)
    assert stored is not None and stored.document == as_id(nova["instance.lock"], synced).document
    assert aliases(ready) == {old: (False, False), new: (True, True)}

    ready.drop_index(old)
    assert [i.name for i in ready.indexes("instance")] == [new]
    assert ready.count("instance") == 2


def test_a_write_alias_on_two_indexes_writes_both(ready: SearchEngine) -> None:
    old = live_index(ready)
    new = f"{ready.prefix}-instance-sync2"
    ready.create_index("instance", new, bulk_load=True)
    ready.set_aliases("instance", read=old, write=[old, new])
    doc_id = new_id()
    assert statuses(ready.bulk([op(doc_id, 3)])) == [OK]
    ready.refresh("instance")
    assert {i.name: i.docs for i in ready.indexes("instance")} == {old: 1, new: 1}
    assert aliases(ready) == {old: (True, True), new: (False, True)}
    assert ready.delete("instance", [doc_id]) == 1
    ready.refresh("instance")
    assert sum(i.docs for i in ready.indexes("instance")) == 0


def test_get_many_reads_the_newest_write_index(ready: SearchEngine) -> None:
    old = live_index(ready)
    doc_id = new_id()
    ready.bulk([op(doc_id, 1, display_name="old copy")])
    new = f"{ready.prefix}-instance-sync3"
    ready.create_index("instance", new, bulk_load=True)
    ready.set_aliases("instance", read=old, write=[old, new])
    list(ready.bulk_index(new, iter([op(doc_id, 2, display_name="synced copy")])))
    ready.refresh("instance")
    assert ready.get_many("instance", [doc_id])[doc_id].document["display_name"] == "synced copy"
    stored = ready.get("instance", doc_id)
    assert stored is not None and stored.document["display_name"] == "old copy"
    # ``index``: that index alone (a sync's check of its new index), newer or not.
    assert ready.get_many("instance", [doc_id], index=old)[doc_id].version == 1
    assert ready.get_many("instance", [doc_id], index=new)[doc_id].version == 2
    with pytest.raises(IndexMissing):
        ready.get_many("instance", [doc_id], index=f"{ready.prefix}-instance-none")


def test_live_and_bulk_sync_writes_obey_one_version_order(ready: SearchEngine) -> None:
    old = live_index(ready)
    new = f"{ready.prefix}-instance-sync4"
    ready.create_index("instance", new, bulk_load=True)
    ready.set_aliases("instance", read=old, write=[old, new])
    synced_first, live_first = new_id(), new_id()
    # The sync copies an old state; a live notification then brings a newer one.
    assert statuses(ready.bulk_index(new, iter([op(synced_first, 1, display_name="s1")]))) == [OK]
    assert statuses(ready.bulk([op(synced_first, 2, display_name="live2")])) == [OK]
    # A live notification lands first; the sync then reads an older state of the cell.
    assert statuses(ready.bulk([op(live_first, 5, display_name="live5")])) == [OK]
    late = ready.bulk_index(new, iter([op(live_first, 4, display_name="s4")]))
    assert statuses(late) == [STALE]
    ready.finish_bulk_load(new)
    ready.set_aliases("instance", read=new, write=[new])
    ready.refresh("instance")
    versions = dict(ready.iter_versions("instance"))
    assert versions == {synced_first: 2, live_first: 5}
    stored = ready.get("instance", live_first)
    assert stored is not None and stored.document["display_name"] == "live5"


def test_bulk_index_needs_an_existing_index(ready: SearchEngine) -> None:
    with pytest.raises(IndexMissing):
        list(ready.bulk_index(f"{ready.prefix}-instance-absent", iter([op(new_id(), 1)])))


def test_drop_index_leaves_the_live_index_alone(ready: SearchEngine) -> None:
    old = live_index(ready)
    spare = f"{ready.prefix}-instance-spare"
    ready.create_index("instance", spare)
    assert {i.name for i in ready.indexes("instance")} == {old, spare}
    ready.drop_index(spare)
    assert [i.name for i in ready.indexes("instance")] == [old]
    assert statuses(ready.bulk([op(new_id(), 1)])) == [OK]


def test_a_stale_document_is_still_checked_against_the_mapping(ready: SearchEngine) -> None:
    """Elasticsearch parses a document before it compares versions: an older version
    that does not fit the mapping is rejected, not found stale, on every engine."""
    doc_id = new_id()
    assert statuses(ready.bulk([op(doc_id, 5)])) == [OK]
    results = ready.bulk([op(doc_id, 3, flavor_memory_mb="plenty"), op(doc_id, 4, stray=1)])
    assert statuses(results) == [REJECTED, REJECTED]
    assert results[0].reason and "flavor_memory_mb" in results[0].reason
    assert results[1].reason and "stray" in results[1].reason
