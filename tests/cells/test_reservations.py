"""Reservations on the cells: the workflow's rows, claims, node counts and events; a
commit needs no capacity; a boot in a tight cell moves a reservation instead of failing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells.errors import (
    BlankText,
    CellsError,
    DuplicateInstance,
    InstanceNotFound,
    NoValidHost,
    UnknownFlavor,
)
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.nodeevents import NODE_UPDATE, register_node
from cellsight.cells.operations import Operations
from cellsight.cells.reads import get_instance
from cellsight.cells.reservations import (
    CANCEL,
    MODIFY,
    MOVE,
    RENAME,
    RESERVE,
    NotForthcoming,
    ReservationIncomplete,
    Reservations,
)
from cellsight.cells.scheduler import HostState, Resources
from cellsight.cells.schema import compute_nodes
from cellsight.notifications.payloads import InstancePayload
from tests.support.publishers import CollectingPublisher

NODE = {"vcpus": 4, "memory_mb": 16384, "local_gb": 200, "cpu_allocation_ratio": 1.0}


@pytest.fixture
def world(tmp_path: Path) -> Any:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    publisher = CollectingPublisher()
    ops = Operations(registry, publisher, publisher_id="test")
    for host in ("h1", "h2"):
        register_node(ops, "cell1", host, availability_zone="az1", **NODE)
    publisher.take()
    yield registry, cell, ops, Reservations(ops), publisher
    registry.close()


def nodes(registry: CellRegistry, cell: CellMapping) -> dict[str, tuple[int, int]]:
    """host → (vcpus used, reservations)."""
    with registry.cell_engine(cell).connect() as conn:
        rows = conn.execute(sa.select(compute_nodes)).mappings()
        return {r["host"]: (r["vcpus_used"], r["forthcoming_reservations"]) for r in rows}


def row(registry: CellRegistry, cell: CellMapping, uuid: str) -> dict[str, Any]:
    with registry.cell_engine(cell).connect() as conn:
        found = get_instance(conn, uuid)
    assert found is not None
    return found


def instance_events(publisher: CollectingPublisher) -> list[str]:
    return [n.event_type for n in publisher.take() if n.event_type != NODE_UPDATE]


def test_uuid_only_reservation_holds_nothing_and_cannot_commit(world: Any) -> None:
    registry, cell, _, res, publisher = world
    uuid = "0b3e7c4c-0000-4000-8000-0000000000aa"
    made = res.reserve(uuid)
    assert (made.uuid, made.cell.uuid, made.selections) == (uuid, cell.uuid, [])
    stored = row(registry, cell, uuid)
    assert stored["forthcoming"] and stored["host"] is None and stored["display_name"] is None
    assert instance_events(publisher) == [RESERVE]
    assert nodes(registry, cell) == {"h1": (0, 0), "h2": (0, 0)}
    with pytest.raises(ReservationIncomplete) as missing:
        res.commit(uuid)
    assert missing.value.missing == ["display_name", "project_id", "user_id", "flavor", "host"]
    assert publisher.sent == []  # refused: nothing announced
    assert registry.get_instance_mapping(uuid).cell_uuid == cell.uuid


def test_reserve_modify_rename_commit(world: Any) -> None:
    registry, cell, ops, res, publisher = world
    made = res.reserve(flavor="m1.medium")
    assert made.selections and made.payload is not None and made.payload.host
    host = made.payload.host
    assert nodes(registry, cell)[host] == (2, 1)
    publisher.take()
    res.modify(made.uuid, project_id="p", user_id="u", flavor="m1.large", host="h2")
    assert nodes(registry, cell) == {"h1": (0, 0), "h2": (4, 1)} | (
        {} if host == "h1" else {"h1": (0, 0)}
    )
    sent = publisher.take()
    assert [n.event_type for n in sent if n.event_type != NODE_UPDATE] == [MODIFY]
    assert {n.payload.host for n in sent if n.event_type == NODE_UPDATE} == {host, "h2"}
    res.rename(made.uuid, "web")
    assert instance_events(publisher) == [RENAME]
    # The cell fills up with real instances; the commit needs nothing more.
    with pytest.raises(NoValidHost):
        for _ in range(10):
            ops.boot(BootRequest(display_name="x", flavor="m1.large", project_id="p", user_id="u"))
    publisher.take()
    built = res.commit(made.uuid)
    assert (built.forthcoming, built.state, built.display_name, built.host) == (
        False, "active", "web", "h2",
    )  # fmt: skip
    assert instance_events(publisher) == [
        "instance.create.start", "instance.update", "instance.create.end",
    ]  # fmt: skip
    assert nodes(registry, cell)["h2"] == (4, 0)
    with pytest.raises(NotForthcoming):
        res.rename(made.uuid, "again")
    with pytest.raises(NotForthcoming):
        res.cancel(made.uuid)


def test_a_reservation_on_a_named_host_gets_its_selection(world: Any) -> None:
    """Nova's scheduler answers a forced host with one ``Selection``, no alternates: the
    named host's, as the scheduler would have made it for that node."""
    registry, cell, ops, res, _ = world
    made = res.reserve(flavor="m1.medium", host="h2")
    (chosen,) = made.selections
    assert (chosen.service_host, chosen.cell_uuid) == ("h2", cell.uuid)
    with registry.cell_engine(cell).connect() as conn:
        node = conn.execute(sa.select(compute_nodes).where(compute_nodes.c.host == "h2"))
        state = HostState(cell, dict(node.mappings().one()))
    zone = ops.scheduler.default_availability_zone
    want = Resources.of_flavor(get_flavor("m1.medium"))
    assert chosen == state.selection(want, zone)
    assert made.payload is not None and made.payload.host == "h2"
    assert res.reserve(host="h1").selections == []  # no flavor: nothing claimed, no pick


@pytest.mark.parametrize("blank", ["", " "])
@pytest.mark.parametrize("field", ["name", "project_id", "user_id", "flavor", "cell", "host"])
def test_a_blank_attribute_is_refused_naming_it(world: Any, field: str, blank: str) -> None:
    """Given, an attribute is a value: '' never means "none" or "the default" (a host ''
    said "no enabled cell", a cell '' picked one, a name '' was kept)."""
    registry, cell, _, res, publisher = world
    with pytest.raises(BlankText, match=f"^{field} must not be empty"):
        res.reserve(**{"flavor": "m1.small", field: blank})
    made = res.reserve(name="web", project_id="p", user_id="u", flavor="m1.small", host="h1")
    publisher.take()
    before = row(registry, cell, made.uuid)
    if field != "cell":  # a reservation's cell is not modified
        with pytest.raises(BlankText, match=f"^{field} must not be empty"):
            res.modify(made.uuid, **{field: blank})
    if field == "name":
        with pytest.raises(BlankText, match=r"^name must not be empty"):
            res.rename(made.uuid, blank)
    assert row(registry, cell, made.uuid) == before
    assert publisher.take() == []


@pytest.mark.parametrize(
    "field", ["display_name", "project_id", "user_id", "image_ref", "cell", "availability_zone",
              "key_name"],
)  # fmt: skip
def test_a_boot_with_a_blank_attribute_is_refused_naming_it(world: Any, field: str) -> None:
    _, _, ops, _, publisher = world
    given = {"display_name": "web", "flavor": "m1.small", "project_id": "p", "user_id": "u"}
    with pytest.raises(BlankText, match=" must not be empty"):
        ops.boot(BootRequest(**{**given, field: " "}))  # type: ignore[arg-type]
    assert publisher.take() == []


def test_a_modify_to_what_it_holds_is_no_change(world: Any) -> None:
    registry, cell, _, res, publisher = world
    made = res.reserve(name="web", project_id="p", flavor="m1.small", host="h1")
    before = row(registry, cell, made.uuid)
    publisher.take()
    same = res.modify(made.uuid, name="web", project_id="p", flavor="m1.small", host="h1")
    res.rename(made.uuid, "web")
    assert row(registry, cell, made.uuid) == before  # revision and updated_at included
    assert publisher.take() == []
    assert same.display_name == "web" and same.host == "h1"
    changed = res.modify(made.uuid, name="web", user_id="u")
    assert changed.user_id == "u"
    assert row(registry, cell, made.uuid)["revision"] == before["revision"] + 1
    assert instance_events(publisher) == [MODIFY]


def test_a_modify_without_room_changes_nothing(world: Any) -> None:
    registry, cell, _, res, publisher = world
    made = res.reserve(flavor="m1.large", host="h1")
    before = (row(registry, cell, made.uuid), nodes(registry, cell))
    publisher.take()
    with pytest.raises(NoValidHost, match="h1"):
        res.modify(made.uuid, flavor="m1.xlarge")
    with pytest.raises(UnknownFlavor):
        res.modify(made.uuid, flavor="m9.nope")
    assert (row(registry, cell, made.uuid), nodes(registry, cell)) == before
    assert publisher.sent == []


def test_cancel_gives_everything_back(world: Any) -> None:
    registry, cell, _, res, publisher = world
    made = res.reserve(flavor="m1.medium", name="gone")
    publisher.take()
    res.cancel(made.uuid)
    assert instance_events(publisher) == [CANCEL]
    assert nodes(registry, cell) == {"h1": (0, 0), "h2": (0, 0)}
    stored = row(registry, cell, made.uuid)
    assert stored["deleted"] and stored["vm_state"] == "deleted"
    assert registry.get_instance_mapping(made.uuid).queued_for_delete
    with pytest.raises(NotForthcoming):
        res.commit(made.uuid)
    with pytest.raises(InstanceNotFound):
        res.cancel("0b3e7c4c-0000-4000-8000-00000000dead")


def test_a_cancel_on_a_deleted_node_leaves_its_figures_alike(world: Any) -> None:
    """A probe: the node's row soft-deleted behind Cellsight's back (by hand, or by Nova),
    a cancel gave its reservation count back but not its resources, which the claim's
    release leaves on a deleted node."""
    registry, cell, _, res, _ = world
    made = res.reserve(flavor="m1.medium", host="h1")
    with registry.cell_engine(cell).begin() as conn:
        conn.execute(
            compute_nodes.update().where(compute_nodes.c.host == "h1").values(deleted=True)
        )
    res.cancel(made.uuid)
    assert nodes(registry, cell)["h1"] == (2, 1)  # neither given back


def test_a_tight_cell_moves_a_reservation_rather_than_refuse(world: Any) -> None:
    registry, cell, ops, res, publisher = world
    a = res.reserve(flavor="m1.medium", host="h1").uuid
    b = res.reserve(flavor="m1.medium", host="h2").uuid
    publisher.take()
    # 2 of 4 VCPUs held on each host: no host can take 4 without a move.
    booted = ops.boot(
        BootRequest(display_name="big", flavor="m1.large", project_id="p", user_id="u")
    )
    instance = booted.instances[0]
    moved = [n for n in publisher.sent if n.event_type == MOVE]
    assert len(moved) == 1
    payload = moved[0].payload
    assert isinstance(payload, InstancePayload) and payload.uuid in (a, b)
    assert payload.host != instance.host and payload.forthcoming
    assert nodes(registry, cell)[instance.host] == (4, 0)
    assert nodes(registry, cell)[payload.host] == (4, 2)  # type: ignore[index]
    # Now the cell is truly full: a refusal, and nothing moved.
    publisher.take()
    with pytest.raises(NoValidHost):
        ops.boot(BootRequest(display_name="more", flavor="m1.tiny", project_id="p", user_id="u"))
    assert publisher.sent == []


def test_reserve_refuses_a_bad_uuid_and_a_taken_one(world: Any) -> None:
    _, _, _, res, publisher = world
    with pytest.raises(CellsError, match="not a UUID"):
        res.reserve("nope")
    made = res.reserve(flavor="m1.tiny")
    publisher.take()
    with pytest.raises(DuplicateInstance, match=made.uuid):
        res.reserve(made.uuid)
    assert publisher.sent == []
    assert res.registry.get_instance_mapping(made.uuid)  # the first one's mapping stays
