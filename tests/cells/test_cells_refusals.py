"""The cell contract's operations that fail or are refused: a failure before commit rolls
back and emits nothing, a lock or a bad request is refused by name. One suite, unchanged
on SQLite, PostgreSQL and MariaDB (see ``test_cells_contract.py``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from cellsight.cells.database import write_transaction
from cellsight.cells.errors import (
    DuplicateInstance,
    InstanceLocked,
    InstanceNotFound,
    InvalidInstanceState,
    InvalidTag,
    NoValidHost,
    UnknownCell,
    UnknownFlavor,
)
from cellsight.cells.instances import Actor
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.rows import payload_to_row
from cellsight.cells.schema import UTCDateTime, instances
from tests.support.cell_contract import boot, full_payload, node_usage, row_of
from tests.support.publishers import CollectingPublisher
from tests.support.services import DatabaseFactory


def _fail_on(action: str) -> Callable[[str, sa.Connection], None]:
    def hook(name: str, conn: sa.Connection) -> None:
        if name == action:
            raise RuntimeError(f"injected failure in {name}")

    return hook


def test_failed_action_rolls_back_and_emits_nothing(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops).uuid
    publisher.take()
    before = row_of(registry, cell, uuid)
    failing = Operations(registry, publisher, before_commit=_fail_on("power_off"))
    with pytest.raises(RuntimeError, match="injected"):
        failing.power_off(uuid)
    failing = Operations(registry, publisher, before_commit=_fail_on("delete"))
    with pytest.raises(RuntimeError, match="injected"):
        failing.delete(uuid)
    assert publisher.sent == []
    assert row_of(registry, cell, uuid) == before
    assert registry.get_instance_mapping(uuid).queued_for_delete is False


def test_failed_boot_removes_mapping_and_emits_nothing(
    registry: CellRegistry, cell: CellMapping, publisher: CollectingPublisher
) -> None:
    failing = Operations(registry, publisher, before_commit=_fail_on("create"))
    uuid = "0b3e7c4c-0000-4000-8000-000000000001"
    usage = node_usage(registry, cell)
    with pytest.raises(RuntimeError, match="injected"):
        boot(failing, uuids=[uuid])
    assert publisher.sent == []
    assert row_of(registry, cell, uuid) is None
    with pytest.raises(InstanceNotFound):
        registry.get_instance_mapping(uuid)
    assert node_usage(registry, cell) == usage


def test_unique_violation_in_cell_rolls_back_boot(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    # A row the API database does not know: the boot's mapping succeeds, its insert fails.
    uuid = "0b3e7c4c-0000-4000-8000-000000000002"
    with write_transaction(registry.cell_engine(cell)) as conn:
        conn.execute(instances.insert().values(**payload_to_row(full_payload(uuid))))
    usage = node_usage(registry, cell)
    with pytest.raises(DuplicateInstance, match=uuid):
        boot(ops, uuids=[uuid])
    assert publisher.sent == []
    with pytest.raises(InstanceNotFound):
        registry.get_instance_mapping(uuid)
    assert node_usage(registry, cell) == usage
    # The mapping side: a uuid already mapped is refused before any cell work.
    booted = boot(ops).uuid
    publisher.take()
    with pytest.raises(DuplicateInstance, match=booted):
        boot(ops, uuids=[booted])
    assert publisher.sent == []
    assert registry.get_instance_mapping(booted).cell_uuid == cell.uuid


def test_locked_instance_refuses_non_admin(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops).uuid
    ops.lock(uuid, "legal hold")
    publisher.take()
    owner = Actor(project_id="p1", user_id="u1", is_admin=False)
    with pytest.raises(InstanceLocked, match="legal hold"):
        ops.power_off(uuid, actor=owner)
    with pytest.raises(InstanceNotFound):
        ops.power_off(uuid, actor=Actor(project_id="other", is_admin=False))
    assert publisher.sent == []
    ops.power_off(uuid)  # an admin may
    ops.unlock(uuid, actor=owner)
    ops.power_on(uuid, actor=owner)
    row = row_of(registry, cell, uuid)
    assert row is not None and (row["vm_state"], row["action_initiator_project"]) == (
        "active",
        "p1",
    )


def test_invalid_requests_are_named(
    ops: Operations, publisher: CollectingPublisher, registry: CellRegistry, cell: CellMapping
) -> None:
    uuid = boot(ops).uuid
    publisher.take()
    with pytest.raises(InvalidInstanceState, match=r"power on.*'active'"):
        ops.power_on(uuid)
    with pytest.raises(UnknownFlavor, match=r"m9\.huge"):
        ops.resize(uuid, "m9.huge")
    with pytest.raises(InstanceNotFound, match="0b3e7c4c"):
        ops.power_off("0b3e7c4c-0000-4000-8000-00000000dead")
    with pytest.raises(NoValidHost):
        ops.live_migrate(uuid, "no-such-host")
    with pytest.raises(UnknownCell, match=r"'atlantis'.*cell1"):
        boot(ops, cell="atlantis")
    row = row_of(registry, cell, uuid)
    assert row is not None
    for refused in (
        lambda: ops.resize(uuid, row["flavor"]["name"]),
        lambda: ops.live_migrate(uuid, row["host"]),
    ):
        with pytest.raises(InvalidInstanceState) as why:  # no state would do: none listed
            refused()
        assert str(why.value).endswith("in state 'active'"), str(why.value)
    # Nova's tag rules (Tempest's server schema refused a listing holding 'z,w').
    for tags in (["x", "z,w"], ["a/b"], ["t" * 61], [""], [f"t{n}" for n in range(51)]):
        with pytest.raises(InvalidTag):
            ops.set_tags(uuid, tags)
        with pytest.raises(InvalidTag):
            boot(ops, tags=tags)
    assert row_of(registry, cell, uuid)["tags"] == row["tags"]  # type: ignore[index]
    assert publisher.sent == []


@pytest.mark.services
def test_a_mysql_zero_date_reads_as_no_date(make_database: DatabaseFactory) -> None:
    """Old MariaDB/MySQL rows written without strict mode may hold the zero date, which
    the driver returns as text: it failed every read of its row (sync, verify and the
    fan-out, a 500), as an adversarial probe found. It reads as no date."""
    engine = sa.create_engine(make_database("mariadb"))
    table = sa.Table(
        "zero_dates",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", UTCDateTime()),
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("SET SESSION sql_mode=''")
        conn.exec_driver_sql("INSERT INTO zero_dates VALUES (1, '0000-00-00 00:00:00')")
        conn.exec_driver_sql("INSERT INTO zero_dates VALUES (2, '2026-01-02 03:04:05.000006')")
    with engine.connect() as conn:
        read = {row.id: row.at for row in conn.execute(sa.select(table.c.id, table.c.at))}
    engine.dispose()
    assert read == {1: None, 2: datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)}
