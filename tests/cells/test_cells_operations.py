"""The cell contract's operations that succeed, and the scheduler that places boots: one
suite, unchanged on SQLite, PostgreSQL and MariaDB (see ``test_cells_contract.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cellsight.cells.database import connect
from cellsight.cells.errors import InvalidInstanceState, NoValidHost
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.reads import count_instances
from cellsight.cells.scheduler import Scheduler
from cellsight.notifications.payloads import (
    InstanceActionPayload,
    InstanceCreatePayload,
    InstanceUpdatePayload,
)
from tests.support.cell_contract import boot, node_usage, row_of
from tests.support.publishers import CollectingPublisher

# ------------------------------------------------------------------- operations


def test_boot_writes_row_mapping_and_events(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    result = ops.boot(BootRequest("web", "m1.small", "p1", "u1", count=2, tags=["b", "a"]))
    assert len(result.selections) == 2
    for choices in result.selections:
        assert len(choices) == 3  # chosen + 2 alternates
        assert {s.cell_uuid for s in choices} == {cell.uuid}
        assert len({s.service_host for s in choices}) == 3
    assert [t for t in publisher.event_types if t.startswith("instance.")] == (
        ["instance.create.start", "instance.update", "instance.create.end"] * 2
    )
    for payload in result.instances:
        mapping = registry.get_instance_mapping(payload.uuid)
        assert (mapping.cell_uuid, mapping.project_id, mapping.queued_for_delete) == (
            cell.uuid,
            "p1",
            False,
        )
        row = row_of(registry, cell, payload.uuid)
        assert row is not None and row["revision"] == 1 and row["vm_state"] == "active"
    start, update, end = publisher.sent[:3]
    assert isinstance(end.payload, InstanceCreatePayload)
    assert (end.payload.revision, end.payload.cell_uuid, end.payload.forthcoming) == (
        1,
        cell.uuid,
        False,
    )
    assert end.payload.tags == ["a", "b"]
    assert isinstance(start.payload, InstanceCreatePayload) and start.payload.revision == 0
    assert isinstance(update.payload, InstanceUpdatePayload)
    assert update.payload.state_update is not None
    assert (update.payload.state_update.old_state, update.payload.state_update.state) == (
        "building",
        "active",
    )
    used = node_usage(registry, cell)
    assert sum(u[0] for u in used.values()) == 2  # two m1.small, one VCPU each
    assert {result.selections[0][0].service_host, result.selections[1][0].service_host} == {
        h for h, u in used.items() if u[0]
    }


ACTIONS: list[
    tuple[str, Callable[[Operations, str], InstanceActionPayload], list[str], dict[str, Any]]
] = [
    (
        "power_off",
        lambda o, u: o.power_off(u),
        ["instance.power_off.start", "instance.update", "instance.power_off.end"],
        {"vm_state": "stopped", "power_state": "shutdown"},
    ),
    (
        "power_on",
        lambda o, u: o.power_on(u),
        ["instance.power_on.start", "instance.update", "instance.power_on.end"],
        {"vm_state": "active", "power_state": "running"},
    ),
    (
        "reboot",
        lambda o, u: o.reboot(u, hard=True),
        ["instance.reboot.start", "instance.update", "instance.reboot.end"],
        {"vm_state": "active", "task_state": None},
    ),
    (
        "resize",
        lambda o, u: o.resize(u, "m1.large"),
        ["instance.resize.start", "instance.update", "instance.resize.end"],
        {"flavor_name": "m1.large", "vcpus": 4, "memory_mb": 8192},
    ),
    (
        "live_migrate",
        lambda o, u: o.live_migrate(u, "host3"),
        [
            "instance.live_migration_post.start",
            "instance.update",
            "instance.live_migration_post.end",
        ],
        {"host": "host3", "node": "host3"},
    ),
    (
        "lock",
        lambda o, u: o.lock(u, "audit"),
        ["instance.lock"],
        {"locked": True, "locked_reason": "audit"},
    ),
    ("unlock", lambda o, u: o.unlock(u), ["instance.unlock"], {"locked": False}),
    (
        "rename",
        lambda o, u: o.rename(u, "renamed"),
        ["instance.update"],
        {"display_name": "renamed"},
    ),
    (
        "metadata",
        lambda o, u: o.update_metadata(u, {"a": "1", "b": "2"}, ["b"]),
        ["instance.update"],
        {"metadata": {"a": "1"}},
    ),
    ("tags", lambda o, u: o.set_tags(u, ["x", "y"]), ["instance.update"], {"tags": ["x", "y"]}),
    (
        "delete",
        lambda o, u: o.delete(u),
        ["instance.delete.start", "instance.update", "instance.delete.end"],
        {"vm_state": "deleted", "deleted": True},
    ),
]


def test_every_action_commits_bumps_revision_and_emits_after_commit(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops, cell=cell.name).uuid
    publisher.take()
    for name, act, events, expected in ACTIONS:
        before = row_of(registry, cell, uuid)
        assert before is not None
        returned = act(ops, uuid)
        after = row_of(registry, cell, uuid)
        assert after is not None
        assert after["revision"] == before["revision"] + 1, name
        assert after["updated_at"] > before["updated_at"], name
        assert {k: after[k] for k in expected} == expected, name
        # compute_node.update events are checked in test_node_events.py.
        sent = [n for n in publisher.take() if n.event_type.startswith("instance.")]
        assert [n.event_type for n in sent] == events, name
        assert returned.revision == after["revision"]
        # The last event carries the committed snapshot; a start the one before.
        assert sent[-1].payload.revision == after["revision"]  # type: ignore[attr-defined]
        assert sent[-1].payload.cell_uuid == cell.uuid  # type: ignore[attr-defined]
        if len(events) == 3:
            assert sent[0].payload.revision == before["revision"]  # type: ignore[attr-defined]
            update = sent[1].payload
            assert isinstance(update, InstanceUpdatePayload) and update.state_update is not None
            assert update.state_update.old_state == before["vm_state"]
            assert update.state_update.state == after["vm_state"]
    assert node_usage(registry, cell)["host3"] == (0, 0, 0)  # the delete gave it back


def test_rename_event_names_the_old_name(ops: Operations, publisher: CollectingPublisher) -> None:
    uuid = boot(ops, display_name="old").uuid
    publisher.take()
    ops.rename(uuid, "new")
    (update,) = publisher.take()
    assert isinstance(update.payload, InstanceUpdatePayload)
    assert (update.payload.old_display_name, update.payload.display_name) == ("old", "new")


def test_soft_delete_keeps_row_and_flags_mapping(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    uuid = boot(ops).uuid
    ops.delete(uuid)
    row = row_of(registry, cell, uuid)
    assert row is not None
    assert (row["deleted"], row["vm_state"]) == (True, "deleted")
    assert row["deleted_at"] is not None and row["terminated_at"] == row["deleted_at"]
    mapping = registry.get_instance_mapping(uuid)
    assert (mapping.cell_uuid, mapping.queued_for_delete) == (cell.uuid, True)
    with pytest.raises(InvalidInstanceState, match="deleted"):
        ops.power_off(uuid)
    with connect(registry.cell_engine(cell)) as conn:
        assert count_instances(conn) == 1
        assert count_instances(conn, include_deleted=False) == 0


# -------------------------------------------------------------------- scheduler


def test_scheduler_keeps_alternates_in_one_cell_and_respects_capacity(
    registry: CellRegistry, add_cell: Callable[..., CellMapping]
) -> None:
    small = add_cell(
        "small", hosts=("s1", "s2"), vcpus=4, memory_mb=8192, local_gb=100, cpu_allocation_ratio=1.0
    )
    big = add_cell("big", hosts=("b1", "b2", "b3"), vcpus=64, memory_mb=262_144, local_gb=4000)
    scheduler = Scheduler(registry, alternates=2)
    picks = scheduler.select_destinations(get_flavor("m1.medium"), count=3)
    assert len(picks) == 3
    assert {s.cell_uuid for choices in picks for s in choices} == {big.uuid}
    assert all(len(choices) == 3 for choices in picks)
    # Pinned to the small cell: two m1.large (4 VCPU each) fit, a third does not.
    picks = scheduler.select_destinations(get_flavor("m1.large"), count=2, cell="small")
    assert sorted(c[0].service_host for c in picks) == ["s1", "s2"]
    assert picks[0][0].limits is not None and picks[0][0].limits.vcpu == 4
    with pytest.raises(NoValidHost, match=r"3 x m1\.large"):
        scheduler.select_destinations(get_flavor("m1.large"), count=3, cell=small.uuid)
    with pytest.raises(NoValidHost, match="availability zone 'nowhere'"):
        scheduler.select_destinations(get_flavor("m1.tiny"), availability_zone="nowhere")


def test_a_capacity_past_a_selections_limits_is_capped(
    registry: CellRegistry, add_cell: Callable[..., CellMapping]
) -> None:
    """An adversarial probe: a node whose capacity times its allocation ratio passed 64
    bits failed every boot it was weighed first for (SchedulerLimits refused the limit;
    the API's reservation answered 500). A Selection carries the limit capped."""
    most = 2**31 - 1  # what the cells' Integer columns hold
    add_cell("huge", hosts=("h1",), vcpus=most, memory_mb=most, cpu_allocation_ratio=1e10)
    (choices,) = Scheduler(registry).select_destinations(get_flavor("m1.tiny"))
    limits = choices[0].limits
    assert limits is not None and limits.vcpu == 2**63 - 1  # past 64 bits: capped
    assert limits.memory_mb == most  # times 1.0: as it is
