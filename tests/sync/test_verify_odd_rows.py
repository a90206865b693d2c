"""``index verify`` over rows written by hand that the compare cannot place."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.indexer.antientropy import verify_resource
from cellsight.indexer.sync import SyncOptions, run_sync


def test_a_uuid_stored_as_a_blob_fails_its_cell_by_name_and_tombstones_nothing(
    make_world: Any,
) -> None:
    """An adversarial probe: a SQLite row whose uuid was a BLOB (sorted after every text,
    and read by ``str()`` as "b'…'") made its live document an orphan, which the first
    ``--repair`` tombstoned, and every later one found "missing" and left, exit 0."""
    world = make_world("sqlite", "embedded", cells=2, instances=10)
    one, _ = world.cells
    run_sync(world.engine, world.registry, SyncOptions())
    victim = sorted(world.revisions(one))[0]
    with connect(world.registry.cell_engine(one)) as conn, conn.begin():
        conn.execute(
            sa.text("UPDATE instances SET uuid = CAST(uuid AS BLOB) WHERE uuid = :u"),
            {"u": victim},
        )
    for repair in (False, True, True):
        report = verify_resource(world.engine, world.registry, "instance", repair=repair)
        first, second = report.cells
        assert first.failed is not None and "uuid stored as bytes, not text" in first.failed
        assert first.repaired == 0 and not report.ok
        assert second.failed is None and second.drift == 0
    stored = world.engine.get("instance", victim)
    assert stored is not None and stored.document["deleted"] is False  # still listed
