"""``index verify`` and a document filed under another cell than its row's.

Such a document is not an orphan of the cell it is filed under (its server is live:
tombstoning it would show a running server as deleted), and in its row's cell it is
``misfiled``: repair refiles it once the row's revision is above the document's
version, and reports it until then. An orphan is never tombstoned on a guess: when
another registered cell cannot be read, repair holds its tombstones back.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.indexer.antientropy import verify_resource
from cellsight.indexer.engines.base import WriteOp, WriteStatus
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.support.sync_world import World


def _misfile(world: World) -> str:
    """A live server of cell one whose document says cell two, one version above its
    row's revision (as a cross-cell mix-up would leave it)."""
    one, two = world.cells
    uuid = next(u for u, d in world.documents().items() if d["cell_uuid"] == one.uuid)
    stored = world.engine.get("instance", uuid)
    assert stored is not None and stored.version == world.revisions(one)[uuid]
    version = stored.version + 1
    doc = {**stored.document, "cell_uuid": two.uuid, "version": version}
    (written,) = world.engine.bulk([WriteOp("instance", uuid, version, doc)])
    assert written.status is WriteStatus.OK
    return uuid


def test_a_misfiled_document_is_reported_not_tombstoned(world: World) -> None:
    engine, registry = world.engine, world.registry
    one, two = world.cells
    run_sync(engine, registry, SyncOptions())
    uuid = _misfile(world)

    found = verify_resource(engine, registry, "instance")
    first, second = found.cells
    assert (first.misfiled, first.missing, first.samples["misfiled"]) == (1, 0, [uuid])
    assert (second.orphaned, second.row_elsewhere) == (0, 1)
    assert found.drift == 1

    # Its version is above the row's revision: repair cannot refile it and says so.
    held = verify_resource(engine, registry, "instance", repair=True)
    first, second = held.cells
    assert (first.misfiled_held, first.repaired, second.repaired) == (1, 0, 0)
    assert "filed under another cell" in first.errors[0] and not held.ok
    stored = engine.get("instance", uuid)
    assert stored is not None and stored.document["deleted"] is False
    assert stored.document["cell_uuid"] == two.uuid

    # Once the row moves past it, repair refiles it under its row's cell and converges.
    world.bump(one, [uuid])
    world.bump(one, [uuid], display_name="moved on")
    refiled = verify_resource(engine, registry, "instance", repair=True)
    assert refiled.ok and refiled.cells[0].repaired == 1 and refiled.cells[1].repaired == 0
    assert verify_resource(engine, registry, "instance").drift == 0
    world.assert_index_equals_cells()


def test_verifying_only_the_cell_it_is_filed_under_leaves_it_live(world: World) -> None:
    engine, registry = world.engine, world.registry
    two = world.cells[1]
    run_sync(engine, registry, SyncOptions())
    uuid = _misfile(world)
    report = verify_resource(engine, registry, "instance", cells=[two.name], repair=True)
    (cell,) = report.cells
    assert (cell.orphaned, cell.row_elsewhere, cell.repaired) == (0, 1, 0)
    stored = engine.get("instance", uuid)
    assert stored is not None and stored.document["deleted"] is False


def test_orphans_wait_while_another_cell_cannot_be_read(make_world: Any) -> None:
    world: World = make_world("sqlite", "embedded", cells=2, instances=10)
    engine, registry = world.engine, world.registry
    one, two = world.cells
    run_sync(engine, registry, SyncOptions())
    template = next(d for d in world.documents().values() if d["cell_uuid"] == two.uuid)
    orphan = str(uuidlib.uuid4())
    engine.bulk([WriteOp("instance", orphan, 1, {**template, "uuid": orphan, "version": 1})])
    with connect(registry.cell_engine(one)) as conn, conn.begin():
        conn.execute(sa.text("ALTER TABLE instances RENAME TO instances_away"))

    report = verify_resource(engine, registry, "instance", cells=[two.name], repair=True)
    (cell,) = report.cells
    assert cell.orphaned == 1 and cell.repaired == 0
    assert cell.errors == [
        "orphans not repaired: another cell unreadable (OperationalError: no such table: instances)"
    ]
    stored = engine.get("instance", orphan)
    assert stored is not None and stored.document["deleted"] is False

    with connect(registry.cell_engine(one)) as conn, conn.begin():
        conn.execute(sa.text("ALTER TABLE instances_away RENAME TO instances"))
    repaired = verify_resource(engine, registry, "instance", cells=[two.name], repair=True)
    assert repaired.ok and repaired.cells[0].repaired == 1
    stored = engine.get("instance", orphan)
    assert stored is not None and stored.document["deleted"] is True


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_the_same_uuid_in_two_cells_is_indexed_once_and_syncs(
    make_world: Any, engine_kind: str, offset: int
) -> None:
    """An adversarial probe copied a row into a second cell: with the copies' revisions
    apart every full sync failed ("misfiled ... index sync rebuilds them"), with them
    equal the sync passed and every ``verify --repair`` then failed the same way. Both
    rows are real: the document is one, filed under either cell, and neither verify nor
    the sync counts the other as drift."""
    from cellsight.cells.schema import instances

    world: World = make_world("sqlite", engine_kind)
    engine, registry = world.engine, world.registry
    one, two = world.cells
    run_sync(engine, registry, SyncOptions(keep_old=0))
    uuid = sorted(world.revisions(one))[2]
    with registry.cell_engine(one).connect() as conn:
        original = conn.execute(sa.select(instances).where(instances.c.uuid == uuid)).one()
    row = dict(original._mapping)
    row.pop("id")
    row["revision"] += offset
    with registry.cell_engine(two).begin() as conn:
        conn.execute(instances.insert().values(**row))

    for _ in range(2):  # a sync over the twins, and the next one
        report = run_sync(engine, registry, SyncOptions(keep_old=0))
        assert report.twins == 1
    stored = engine.get("instance", uuid)
    assert stored is not None and stored.document["cell_uuid"] in (one.uuid, two.uuid)
    if offset:  # the version rule: the higher revision's cell
        assert stored.document["cell_uuid"] == (two.uuid if offset > 0 else one.uuid)
    for repair in (False, True):
        found = verify_resource(engine, registry, "instance", repair=repair)
        assert found.ok and found.drift == 0, found.as_dict()
        assert sum(c.twin for c in found.cells) == 1
        assert sum(c.repaired for c in found.cells) == 0


def test_a_twin_updated_behind_the_index_is_refiled_under_its_cell(
    make_world: Any, engine_kind: str
) -> None:
    """A review of the twins: the copy in cell two updated by lost notifications is the
    newer row; verify must refile the document there, as the next sync would, not call
    it a twin and leave the older one."""
    from cellsight.cells.schema import instances

    world: World = make_world("sqlite", engine_kind)
    engine, registry = world.engine, world.registry
    one, two = world.cells
    uuid = sorted(world.revisions(one))[2]
    with registry.cell_engine(one).connect() as conn:
        found = conn.execute(sa.select(instances).where(instances.c.uuid == uuid)).one()
    row = dict(found._mapping)
    row.pop("id")
    with registry.cell_engine(two).begin() as conn:
        conn.execute(instances.insert().values(**row))
    run_sync(engine, registry, SyncOptions(keep_old=0))
    world.bump(two, [uuid], display_name="renamed in two")
    repaired = verify_resource(engine, registry, "instance", repair=True)
    assert repaired.ok and sum(c.repaired for c in repaired.cells) == 1, repaired.as_dict()
    stored = engine.get("instance", uuid)
    assert stored is not None and stored.document["cell_uuid"] == two.uuid
    assert stored.document["display_name"] == "renamed in two"
    again = verify_resource(engine, registry, "instance", repair=True)
    assert again.ok and again.drift == 0 and sum(c.twin for c in again.cells) == 1
