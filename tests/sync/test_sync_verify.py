"""``index verify``: drift made on purpose is found with exact counts per cell, fixed by
``--repair`` through versioned writes, and a second verify finds nothing."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from cellsight.cells.instances import BootRequest
from cellsight.cells.nodes import add_compute_node
from cellsight.indexer.antientropy import verify_resource
from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteStatus
from cellsight.indexer.engines.http import HttpEngine
from cellsight.indexer.index_roles import is_synced
from cellsight.indexer.sync import SyncOptions, run_sync
from cellsight.indexer.verify import VerifyReport
from tests.support.sync_world import IndexingPublisher, World


def _counts(report: VerifyReport) -> dict[str, dict[str, int]]:
    keys = ("missing", "stale", "orphaned", "ahead")
    return {c.name: {k: getattr(c, k) for k in keys if getattr(c, k)} for c in report.cells}


def _drift(world: World) -> str:
    """Every kind of drift, in both cells; returns the orphan's uuid."""
    engine = world.engine
    one, two = world.cells
    docs = world.documents()
    live_one = [u for u, d in docs.items() if d["cell_uuid"] == one.uuid and not d["deleted"]]
    # missing: documents deleted from the index (long ago: see _forget_deletes)
    _forget_deletes(engine)
    assert engine.delete("instance", live_one[:2]) == 2
    # stale: a stale version written (the row moved on twice; the first change's
    # document arrives, the second's is lost)
    stored = engine.get("instance", live_one[2])
    assert stored is not None
    world.bump(one, [stored.id])
    world.bump(one, [stored.id])
    late = {**stored.document, "version": stored.version + 1, "display_name": "late"}
    (written,) = engine.bulk([WriteOp("instance", stored.id, stored.version + 1, late)])
    assert written.status is WriteStatus.OK
    # stale: rows changed without any notification
    world.bump(two, list(world.revisions(two))[:3], display_name="behind its back")
    # notifications dropped before the bus: a new instance, and a rename
    publisher = IndexingPublisher(engine)
    publisher.drop = True
    ops = world.ops(publisher)
    request = BootRequest(display_name="lost", flavor="m1.tiny", project_id="p", user_id="u",
                          cell=two.name)  # fmt: skip
    ops.boot(request)
    ops.rename(live_one[3], "renamed, never told")
    # orphaned: a live document whose row does not exist
    template = engine.get("instance", live_one[4])
    assert template is not None
    orphan = str(uuidlib.uuid4())
    doc = {**template.document, "uuid": orphan}
    engine.bulk([WriteOp("instance", orphan, template.version, doc)])
    return orphan


def _forget_deletes(engine: SearchEngine, resource: str = "instance") -> None:
    """Elasticsearch and OpenSearch refuse to recreate a document deleted less than
    ``index.gc_deletes`` (60 s) ago at its old version; make "ago" now."""
    if isinstance(engine, HttpEngine):
        for info in engine.indexes(resource):
            body = {"index": {"gc_deletes": "0s"}}
            engine._send("PUT", f"/{info.name}/_settings", body=body)


def test_verify_finds_exact_drift_and_repair_fixes_it(world: World) -> None:
    engine, registry = world.engine, world.registry
    run_sync(engine, registry, SyncOptions())
    assert verify_resource(engine, registry, "instance").drift == 0
    orphan = _drift(world)
    one, two = world.cells
    found = verify_resource(engine, registry, "instance")
    assert _counts(found) == {
        one.name: {"missing": 2, "stale": 2, "orphaned": 1},
        two.name: {"missing": 1, "stale": 3},
    }
    assert found.cells[0].samples["orphaned"] == [orphan]
    assert all(c.repaired == 0 for c in found.cells)  # a plain verify writes nothing
    repaired = verify_resource(engine, registry, "instance", repair=True)
    assert _counts(repaired) == _counts(found)
    assert sum(c.repaired for c in repaired.cells) == 9
    again = verify_resource(engine, registry, "instance")
    assert again.drift == 0 and _counts(again) == {one.name: {}, two.name: {}}
    assert again.cells[0].tombstones_without_row == 1
    # The orphan is a versioned tombstone now; everything else equals the cells.
    tomb = engine.get("instance", orphan)
    assert tomb is not None and tomb.document["deleted"] is True
    assert tomb.document["state"] == "deleted"
    engine.delete("instance", [orphan])
    world.assert_index_equals_cells()


def test_node_sync_verify_and_repair(world: World) -> None:
    engine, registry = world.engine, world.registry
    one = world.cells[0]
    for host in ("extra1", "extra2", "extra3"):
        add_compute_node(registry.cell_engine(one), host)
    report = run_sync(engine, registry, SyncOptions(resource="node"))
    assert report.rows == sum(c["rows"] for c in report.cells) > 0
    world.assert_index_equals_cells("node")
    assert is_synced(engine, "node")
    some = [u for u, d in world.documents("node").items() if d["cell_uuid"] == one.uuid][:3]
    _forget_deletes(engine, "node")
    engine.delete("node", some[:2])
    ghost = engine.get("node", some[2])
    assert ghost is not None
    fake = str(uuidlib.uuid4())
    engine.bulk([WriteOp("node", fake, 1, {**ghost.document, "uuid": fake})])
    found = verify_resource(engine, registry, "node", cells=[one.name])
    assert _counts(found) == {one.name: {"missing": 2, "orphaned": 1}}
    verify_resource(engine, registry, "node", repair=True)
    assert verify_resource(engine, registry, "node").drift == 0
    world.assert_index_equals_cells("node")  # the orphan node document was removed


def test_verify_ignores_changes_in_flight(make_world: Any, monkeypatch: Any) -> None:
    """An instance created while the cell stream is past its uuid, whose document the
    live path already wrote, is not an orphan: its row is looked up again first."""
    world: World = make_world("sqlite", "embedded", cells=1, instances=20)
    run_sync(world.engine, world.registry, SyncOptions())
    from cellsight.indexer import verify

    real_diff = verify.diff

    def diff_then_boot(rows: Any, docs: Any) -> Any:
        rows = iter(list(rows))  # the cell's rows as they were
        world.ops().boot(BootRequest(display_name="late", flavor="m1.tiny", project_id="p",
                                     user_id="u"))  # fmt: skip
        return real_diff(rows, docs)

    monkeypatch.setattr(verify, "diff", diff_then_boot)
    report = verify_resource(world.engine, world.registry, "instance", repair=True)
    assert report.cells[0].orphaned == 0 and report.cells[0].repaired == 0
    world.assert_index_equals_cells()


def test_recreating_a_just_deleted_document_is_reported_not_hidden(make_world: Any) -> None:
    world: World = make_world("sqlite", "opensearch", cells=1, instances=10)
    engine = world.engine
    run_sync(engine, world.registry, SyncOptions())
    victim = next(iter(world.revisions(world.cells[0])))
    engine.delete("instance", [victim])
    report = verify_resource(engine, world.registry, "instance", repair=True)
    (cell,) = report.cells
    assert (cell.missing, cell.repaired, cell.repair_refused) == (1, 0, 1)
    assert "recreation refused" in cell.errors[0]
