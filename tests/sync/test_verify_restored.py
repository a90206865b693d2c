"""``index verify --repair`` where its own tombstones meet rows that are not gone: a row
deleted before the purge floor (out of scope, still in the cell), and a row back after
its cell's database was restored. Both found by an adversarial probe of the CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.cells.schema import compute_nodes, instances
from cellsight.indexer.antientropy import verify_resource
from cellsight.indexer.engines.base import WriteOp, WriteStatus
from cellsight.indexer.purge import purge_tombstones
from cellsight.indexer.row_documents import node_row_document
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.support.sync_world import World
from tests.sync.test_sync_verify import _forget_deletes


def _synced(make_world: Any, engine_kind: str) -> World:
    """One SQLite cell, synced into a new index of ``engine_kind``."""
    world: World = make_world("sqlite", engine_kind, cells=1)
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    return world


def _live(world: World, n: int) -> str:
    """The ``n``-th live instance, in uuid order."""
    return sorted(u for u, row in world.rows().items() if not row["deleted"])[n]


def test_a_row_deleted_before_the_floor_loses_its_document(
    make_world: Any, engine_kind: str
) -> None:
    """A server deleted two days ago whose delete notification was lost, under a floor
    of one day: its document was tombstoned with the time of the repair as its deletion
    time, so the index listed it among deleted servers where the fan-out (which leaves
    out rows deleted before the floor) did not. The purge would have removed it."""
    world = _synced(make_world, engine_kind)
    engine, registry = world.engine, world.registry
    purge_tombstones(engine, datetime.now(UTC) - timedelta(days=1), registry=registry)
    (cell,) = world.cells
    victim = _live(world, 3)
    two_days_ago = datetime.now(UTC) - timedelta(days=2)
    world.bump(cell, [victim], deleted=True, vm_state="deleted", deleted_at=two_days_ago)

    found = verify_resource(engine, registry, "instance")
    assert (found.cells[0].orphaned, found.drift) == (1, 1)
    assert engine.get("instance", victim) is not None  # reported, not yet repaired
    repaired = verify_resource(engine, registry, "instance", repair=True)
    assert repaired.ok and repaired.cells[0].repaired == 1
    assert engine.get("instance", victim) is None
    assert verify_resource(engine, registry, "instance").drift == 0


def test_a_restored_row_under_a_repair_tombstone_is_reported_and_synced(
    make_world: Any, engine_kind: str
) -> None:
    """A row archived (deleted outright), tombstoned by repair at its version + 1, then
    restored with the cell's database: the tombstone hid the live server, and once the
    row's next update reached the tombstone's version, verify saw nothing at all. It is
    drift now (``hidden``); repair leaves it (removing the tombstone would race the live
    writer) and says that ``index sync`` rebuilds it, which it does."""
    world = _synced(make_world, engine_kind)
    engine, registry = world.engine, world.registry
    (cell,) = world.cells
    victim = _live(world, 5)
    with connect(registry.cell_engine(cell)) as conn, conn.begin():
        saved = conn.execute(sa.select(instances).where(instances.c.uuid == victim)).one()
        conn.execute(instances.delete().where(instances.c.uuid == victim))
    assert verify_resource(engine, registry, "instance", repair=True).cells[0].repaired == 1
    tombstone = engine.get("instance", victim)
    assert tombstone is not None and tombstone.document["deleted"] is True
    with connect(registry.cell_engine(cell)) as conn, conn.begin():
        conn.execute(instances.insert().values(**saved._mapping))

    found = verify_resource(engine, registry, "instance")
    assert (found.cells[0].hidden, found.cells[0].ahead, found.drift) == (1, 1, 1)
    held = verify_resource(engine, registry, "instance", repair=True)
    assert not held.ok and "index sync rebuilds them" in held.cells[0].errors[0]
    assert (held.cells[0].hidden, held.cells[0].repaired) == (1, 0)
    run_sync(engine, registry, SyncOptions(keep_old=0))
    stored = engine.get("instance", victim)
    assert stored is not None and stored.document["deleted"] is False
    assert stored.version == saved.revision
    # Its next update is an ordinary one now, no longer level with a tombstone.
    world.bump(cell, [victim], display_name="after the restore")
    assert verify_resource(engine, registry, "instance", repair=True).cells[0].repaired == 1
    assert verify_resource(engine, registry, "instance").drift == 0
    world.assert_index_equals_cells()


def test_a_live_document_ahead_of_its_row_is_not_hidden(make_world: Any, engine_kind: str) -> None:
    """Ahead of its row but no tombstone (a live write the row read missed, or a row
    restored under a live document): reported as ahead, neither hidden nor rewritten."""
    world = _synced(make_world, engine_kind)
    engine, registry = world.engine, world.registry
    (cell,) = world.cells
    victim = _live(world, 1)
    with connect(registry.cell_engine(cell)) as conn, conn.begin():
        conn.execute(instances.update().where(instances.c.uuid == victim).values(revision=0))
    found = verify_resource(engine, registry, "instance", repair=True)
    # Ahead and live on both sides: reported as ahead, neither hidden nor rewritten.
    assert (found.cells[0].ahead, found.cells[0].hidden, found.cells[0].repaired) == (1, 0, 0)


def test_a_node_document_ahead_of_its_row_is_rewritten(make_world: Any, engine_kind: str) -> None:
    """A probe: a cell's database restored from a backup took a node's revision back,
    and its document (written only by Cellsight's producers, by the row's revision) kept
    the old usage for good: its next update was dropped as stale, and verify reported
    it ahead and repaired nothing. Read again and still ahead, it is rewritten."""
    world = _synced(make_world, engine_kind)
    engine, registry = world.engine, world.registry
    run_sync(engine, registry, SyncOptions(resource="node", keep_old=0))
    _forget_deletes(engine, "node")
    (cell,) = world.cells
    with connect(registry.cell_engine(cell)) as conn:
        node = conn.execute(sa.select(compute_nodes).order_by(compute_nodes.c.uuid)).first()
    assert node is not None
    c = compute_nodes.c
    # The index as it was before the restore: five updates on, more memory used.
    ahead = {**node_row_document(dict(node._mapping), cell.uuid), "memory_mb_used": 1}
    (written,) = engine.bulk([WriteOp("node", node.uuid, node.revision + 5, ahead)])
    assert written.status is WriteStatus.OK, written.reason
    found = verify_resource(engine, registry, "node")
    assert (found.cells[0].ahead, found.cells[0].node_ahead, found.drift) == (1, 1, 1)
    repaired = verify_resource(engine, registry, "node", repair=True)
    assert repaired.ok and repaired.cells[0].repaired == 1, repaired.cells[0].errors
    stored = engine.get("node", node.uuid)
    assert stored is not None and stored.version == node.revision
    assert stored.document["memory_mb_used"] == node.memory_mb_used
    assert verify_resource(engine, registry, "node").drift == 0
    # And the node's next update is indexed again, no longer below an old version.
    with connect(registry.cell_engine(cell)) as conn, conn.begin():
        conn.execute(
            compute_nodes.update().where(c.uuid == node.uuid).values(revision=c.revision + 1)
        )
    assert verify_resource(engine, registry, "node", repair=True).cells[0].repaired == 1
    world.assert_index_equals_cells("node")
