"""The sync's fast row → document path equals the reference path (the mapping a
notification of the same row goes through) on every dialect, for every row shape."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.cells.errors import CellsError
from cellsight.cells.instances import BootRequest
from cellsight.cells.schema import instances
from cellsight.indexer.cell_streams import CellDocs, Scope
from cellsight.indexer.documents import comparable
from cellsight.indexer.row_documents import SYNC_EVENT
from tests.support.sync_world import IndexingPublisher, World


def _shape_rows(world: World) -> None:
    """Rows as every operation leaves them, plus odd but valid stored values."""
    publisher = IndexingPublisher(world.engine)
    publisher.drop = True  # only the rows matter here
    ops = world.ops(publisher)
    cell = world.cells[0]
    booted = ops.boot(
        BootRequest(
            display_name="shapes", flavor="m1.small", project_id="p", user_id="u", count=6,
            cell=cell.name, tags=["a", "b"], metadata={"k": "v"},
        )
    ).instances  # fmt: skip
    uuids = [p.uuid for p in booted]
    steps = [
        lambda: ops.rename(uuids[0], "renamed ✓"),
        lambda: ops.update_metadata(uuids[0], {"x": "y"}, ["k"]),
        lambda: ops.set_tags(uuids[1], []),
        lambda: ops.power_off(uuids[1]),
        lambda: ops.resize(uuids[2], "m1.large"),
        lambda: ops.live_migrate(uuids[2]),
        lambda: ops.lock(uuids[3], "maintenance"),
        lambda: ops.delete(uuids[4]),
    ]
    for step in steps:
        # a full host or a state the seed left: the other shapes still count
        with contextlib.suppress(CellsError):
            step()
    odd: list[dict[str, Any]] = [
        # NULL everywhere a column allows it (the defaults of the payload apply)
        {"tags": None, "metadata": None, "ip_addresses": None, "block_devices": None,
         "shares": None, "flavor": None, "display_description": None, "progress": None,
         "launched_at": None, "host": None, "node": None},
        # a float stored as an integer, a flavor with extra keys, an address without meta
        {"flavor": {"flavorid": "7", "name": "odd", "memory_mb": 1, "vcpus": 1, "root_gb": 0,
                    "ephemeral_gb": 0, "swap": 0, "rxtx_factor": 2, "vcpu_weight": None,
                    "extra_specs": {"hw:cpu": "1"}, "extra": "ignored"},
         "ip_addresses": [{"address": "fd00::5", "version": 6, "label": "v6"}]},
        # a time with no fraction (the wire form drops it)
        {"created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "updated_at": None},
    ]  # fmt: skip
    with connect(world.registry.cell_engine(cell)) as conn, conn.begin():
        for uuid, values in zip(uuids[5:] + uuids[:2], odd, strict=False):
            conn.execute(instances.update().where(instances.c.uuid == uuid).values(**values))


def _fast_documents(world: World) -> tuple[dict[str, dict[str, Any]], int]:
    docs: dict[str, dict[str, Any]] = {}
    fallbacks = 0
    for cell in world.cells:
        source = CellDocs(Scope("instance"), cell.uuid, SYNC_EVENT)
        with connect(world.registry.cell_engine(cell)) as conn:
            for batch in source.iter_batches(conn, 17):
                docs.update((op.id, comparable(op.document)) for op in batch)
        fallbacks += source.fallbacks
    return docs, fallbacks


def test_fast_path_equals_reference_for_every_row_shape(make_world: Any, dialect: str) -> None:
    world: World = make_world(dialect, "embedded", cells=1, instances=150)
    world.engine.ensure_ready("instance")
    _shape_rows(world)
    fast, fallbacks = _fast_documents(world)
    expected = world.rows()
    assert sorted(fast) == sorted(expected)
    assert [u for u in expected if fast[u] != expected[u]] == []
    assert fallbacks == 0  # every row above took the fast path on this dialect


def test_unusual_values_take_the_reference_path_and_still_agree(make_world: Any) -> None:
    world: World = make_world("sqlite", "embedded", cells=1, instances=5)
    cell = world.cells[0]
    odd: list[dict[str, Any]] = [
        # pydantic turns "4096" into 4096; the fast path does not guess
        {"flavor": {"flavorid": "1", "memory_mb": "4096"}},
        # a wire-wrapped nested object
        {"ip_addresses": [{"nova_object.name": "IpPayload", "nova_object.namespace": "nova",
                           "nova_object.version": "1.0",
                           "nova_object.data": {"address": "10.0.0.9", "version": 4}}]},
        # a time as SQLite's own CURRENT_TIMESTAMP writes it (no fraction)
        {"launched_at": sa.text("CURRENT_TIMESTAMP")},
    ]  # fmt: skip
    with connect(world.registry.cell_engine(cell)) as conn, conn.begin():
        uuids = [u for (u,) in conn.execute(sa.select(instances.c.uuid).order_by("uuid"))]
        for uuid, values in zip(uuids, odd, strict=False):
            conn.execute(instances.update().where(instances.c.uuid == uuid).values(**values))
    fast, fallbacks = _fast_documents(world)
    expected = world.rows()
    assert fast == expected
    assert fallbacks == 3
    assert fast[uuids[1]]["ip4"] == ["10.0.0.9"]


def test_a_row_past_the_contract_is_indexed_as_its_cell_holds_it(make_world: Any) -> None:
    """A row written by other means than Cellsight's or Nova's operations may hold what
    the notification contract refuses (a tag Nova's API refuses, an address or a MAC
    that is none): a sync indexes it as the cell holds it rather than fail."""
    world: World = make_world("sqlite", "embedded", cells=1, instances=3)
    cell = world.cells[0]
    odd: list[dict[str, Any]] = [
        {"tags": ["a,b", "t" * 61]},
        {"ip_addresses": [{"address": "not-an-ip", "version": 99, "mac": "fa:16:3e"}]},
    ]
    with connect(world.registry.cell_engine(cell)) as conn, conn.begin():
        uuids = [u for (u,) in conn.execute(sa.select(instances.c.uuid).order_by("uuid"))]
        for uuid, values in zip(uuids, odd, strict=False):
            conn.execute(instances.update().where(instances.c.uuid == uuid).values(**values))
    fast, _ = _fast_documents(world)
    assert fast[uuids[0]]["tags"] == ["a,b", "t" * 61]
    assert fast[uuids[1]]["ip_addresses"][0]["address"] == "not-an-ip"
