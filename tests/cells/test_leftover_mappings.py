"""A mapping left by a boot or reservation killed between its mapping and its cell
transaction (a crash probe) no longer holds its uuid for ever: once older than any build,
and with no row in its cell, a new boot or reservation of that uuid takes it back."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cellsight.cells.database import Engines, connect, write_transaction
from cellsight.cells.errors import DuplicateInstance
from cellsight.cells.instances import BootRequest
from cellsight.cells.leftovers import DEAD_BUILD, dead_build_age, reclaim
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.reads import get_instance
from cellsight.cells.reservations import Reservations
from cellsight.cells.schema import cell_mappings, instance_mappings
from cellsight.settings import load_settings
from tests.cells.test_cells_cli import Invoke, cli, one_line

__all__ = ["cli"]

LEFT = "0b3a6c1e-0000-4000-8000-00000000001a"


def _leave(registry: CellRegistry, cell: CellMapping, uuid: str = LEFT) -> None:
    """What a build killed after its mapping leaves: the mapping, no row."""
    registry.place_instances(cell.uuid, [(uuid, "p1", "u1")])


def _age(registry: CellRegistry, uuid: str, by: timedelta) -> None:
    m = instance_mappings.c
    with write_transaction(registry.api_engine) as conn:
        conn.execute(
            instance_mappings.update()
            .where(m.instance_uuid == uuid)
            .values(created_at=datetime.now(UTC) - by)
        )


def _row(registry: CellRegistry, uuid: str) -> tuple[str, dict[str, object] | None]:
    cell = registry.locate(uuid)
    with connect(registry.cell_engine(cell)) as conn:
        return cell.uuid, get_instance(conn, uuid)


def test_a_reservation_takes_back_a_dead_builds_uuid_once_old(
    registry: CellRegistry, cell: CellMapping, add_cell: Callable[..., CellMapping], ops: Operations
) -> None:
    other = add_cell("other")
    _leave(registry, other)
    reservations = Reservations(ops)
    with pytest.raises(DuplicateInstance):  # a build may still be under way
        reservations.reserve(LEFT, cell=cell.name, project_id="p2")
    assert registry.cells_of([LEFT]) == {LEFT: other.uuid}
    _age(registry, LEFT, DEAD_BUILD + timedelta(minutes=1))
    made = reservations.reserve(LEFT, cell=cell.name, project_id="p2")
    assert made.cell.uuid == cell.uuid
    where, row = _row(registry, LEFT)
    assert where == cell.uuid and row is not None and row["project_id"] == "p2"
    # Now it is a reservation like any other: cancelled, as before.
    assert reservations.cancel(LEFT).uuid == LEFT


def test_a_boot_of_given_uuids_takes_back_a_dead_builds_uuid(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    _leave(registry, cell)
    _age(registry, LEFT, timedelta(hours=2))
    fresh = "0b3a6c1e-0000-4000-8000-00000000001b"
    made = ops.boot(BootRequest("web", "m1.small", "p1", "u1", count=2, uuids=[LEFT, fresh]))
    assert sorted(p.uuid for p in made.instances) == sorted([LEFT, fresh])
    assert _row(registry, LEFT)[1] is not None


def test_an_old_mapping_with_a_row_is_never_taken(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    made = ops.boot(BootRequest("web", "m1.small", "p1", "u1"))
    (uuid,) = [p.uuid for p in made.instances]
    ops.delete(uuid)  # a deleted instance keeps its row, and its uuid
    _age(registry, uuid, timedelta(days=3))
    with pytest.raises(DuplicateInstance):
        Reservations(ops).reserve(uuid, cell=cell.name)
    assert reclaim(registry, [uuid]) == []
    row = _row(registry, uuid)[1]
    assert row is not None and row["deleted"]


def test_a_leftover_whose_cell_cannot_be_read_is_kept(
    registry: CellRegistry,
    cell: CellMapping,
    add_cell: Callable[..., CellMapping],
    ops: Operations,
    tmp_path: Path,
) -> None:
    """Whether it has a row is unknown: the uuid stays taken."""
    lost = add_cell("lost", hosts=())
    _leave(registry, lost)
    _age(registry, LEFT, timedelta(hours=1))
    with write_transaction(registry.api_engine) as conn:
        conn.execute(
            cell_mappings.update()
            .where(cell_mappings.c.uuid == lost.uuid)
            .values(database_connection=f"sqlite:///{tmp_path / 'gone' / 'lost.db'}")
        )
    with pytest.raises(DuplicateInstance):
        Reservations(ops).reserve(LEFT, cell=cell.name)
    assert registry.cells_of([LEFT]) == {LEFT: lost.uuid}


def test_the_age_of_a_dead_build_grows_with_the_statement_timeout(
    registry: CellRegistry,
) -> None:
    assert dead_build_age(registry) == DEAD_BUILD  # no statement timeout set
    slow = CellRegistry(registry.api_url, Engines(statement_timeout=3600))
    try:
        assert dead_build_age(slow) == timedelta(hours=3)
        # A review: the API bounds its own statements by cell_timeout, and reclaimed
        # after 15 minutes a uuid a CLI boot under a longer db_statement_timeout held.
        slow.build_timeout = 1800
        assert dead_build_age(slow) == timedelta(minutes=90)
    finally:
        slow.close()


def test_the_api_reclaims_after_the_builds_bound_not_its_own(tmp_path: Path) -> None:
    from cellsight.api.app import create_app

    settings = load_settings(data_dir=tmp_path / "data", db_statement_timeout=1800)
    app = create_app(settings)
    registry: CellRegistry = app.state.registry
    try:
        assert registry.engines.timeouts.statement == settings.cell_timeout
        assert dead_build_age(registry) == timedelta(minutes=90)
    finally:
        registry.close()


def test_a_leftover_in_a_cell_that_fails_to_answer_is_kept(
    registry: CellRegistry, cell: CellMapping, ops: Operations, tmp_path: Path
) -> None:
    """A review: a cell that answered with an error the registry does not name (here: no
    instances table) made the new reservation fail with the driver's error, a 500."""
    broken = tmp_path / "broken.db"
    sqlite3.connect(broken).close()
    lost = registry.add_cell("broken", f"sqlite:///{broken}", create_schema=False)
    _leave(registry, lost)
    _age(registry, LEFT, timedelta(hours=1))
    with pytest.raises(DuplicateInstance):
        Reservations(ops).reserve(LEFT, cell=cell.name)
    assert registry.cells_of([LEFT]) == {LEFT: lost.uuid}


def test_ops_reserve_of_a_dead_builds_uuid_from_the_cli(cli: Invoke, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'east.db'}"
    assert cli("cells", "add", "--name", "east", "--db-url", url).exit_code == 0
    assert cli("cells", "add-host", "--cell", "east", "--host", "h1").exit_code == 0
    settings = load_settings(data_dir=tmp_path / "data")
    registry = CellRegistry(settings.resolved_api_db_url)
    try:
        _leave(registry, registry.get_cell("east"))
        refused = cli("ops", "reserve", "--uuid", LEFT)
        assert refused.exit_code == 2 and "already exists" in one_line(refused.output)
        _age(registry, LEFT, timedelta(hours=1))
        made = cli("ops", "reserve", "--uuid", LEFT, "--name", "web")
        assert made.exit_code == 0, made.output
        row = _row(registry, LEFT)[1]
        assert row is not None and row["display_name"] == "web"
    finally:
        registry.close()
