"""Disabling and removing a cell, on every dialect: Nova's ``update_cell --disable`` and
``delete_cell`` rules (living instances always refuse; nodes and the mappings of deleted
instances refuse without ``force``), the removal's one locked transaction against
placements racing it, and the CLI's one-line answers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.cell_removal import remove_cell
from cellsight.cells.database import connect, write_transaction
from cellsight.cells.errors import CellNotEmpty, NoValidHost, UnknownCell
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.reads import count_instances
from cellsight.cells.reservations import Reservations
from cellsight.cells.schema import instance_mappings
from cellsight.cli.errors import LOCKED, RUNTIME, USAGE
from cellsight.clients import build_engine
from cellsight.indexer.index_roles import is_synced
from cellsight.indexer.lock import MaintenanceLock
from cellsight.settings import load_settings
from tests.cli.test_cli_errors import assert_one_line_error, cellsight


def _boot(ops: Operations, count: int = 2, cell: str | None = None) -> list[str]:
    made = ops.boot(BootRequest("web", "m1.small", "p1", "u1", count=count, cell=cell))
    return [p.uuid for p in made.instances]


def _living(registry: CellRegistry, cell: CellMapping) -> int:
    with connect(registry.engines.get(cell.database_url)) as conn:
        return count_instances(conn, include_deleted=False)


def test_a_disabled_cell_takes_no_new_instance_and_keeps_its_own(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    (kept,) = _boot(ops, 1)
    assert registry.set_disabled(cell.name, True).disabled
    assert registry.list_cells(include_disabled=False) == []
    with pytest.raises(NoValidHost):
        _boot(ops, 1)
    # Named, as Nova's host manager leaves a disabled cell's hosts out even when forced.
    with pytest.raises(NoValidHost, match="cell 'cell1' is disabled"):
        _boot(ops, 1, cell=cell.name)
    with pytest.raises(NoValidHost, match="cell 'cell1' is disabled"):
        Reservations(ops).reserve(flavor="m1.small", cell=cell.name, project_id="p1")
    with pytest.raises(NoValidHost, match="cell 'cell1' is disabled"):
        Reservations(ops).reserve(cell=cell.name, project_id="p1")
    ops.power_off(kept)  # its instances are changed as before
    assert [c.uuid for c in registry.list_cells()] == [cell.uuid]  # and listed
    assert not registry.set_disabled(cell.uuid, False).disabled
    assert len(_boot(ops, 1, cell=cell.name)) == 1


def test_an_enabled_cell_or_one_with_living_instances_is_never_removed(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    _boot(ops)
    with pytest.raises(
        CellNotEmpty, match=r"^cell 'cell1' is enabled: `cellsight cells disable cell1` first$"
    ):
        remove_cell(registry, cell.name, force=True)
    registry.set_disabled(cell.name, True)
    for force in (False, True):
        with pytest.raises(CellNotEmpty, match="2 instances not deleted"):
            remove_cell(registry, cell.name, force=force)
    assert registry.get_cell(cell.uuid).uuid == cell.uuid
    assert registry.count_mappings(cell.uuid) == 2


def test_nodes_and_deleted_instances_need_force_which_removes_their_mappings(
    registry: CellRegistry,
    add_cell: Callable[..., CellMapping],
    cell: CellMapping,
    ops: Operations,
) -> None:
    other = add_cell("cell2", hosts=())
    for uuid in _boot(ops):
        ops.delete(uuid)
    registry.set_disabled(cell.name, True)
    # Every reason at once.
    with pytest.raises(CellNotEmpty, match=r"3 compute nodes .*; 2 mappings of deleted"):
        remove_cell(registry, cell.name)
    done = remove_cell(registry, cell.name, force=True)
    assert (done.nodes, done.mappings) == (3, 2)
    assert [c.uuid for c in registry.list_cells()] == [other.uuid]
    assert registry.count_mappings(cell.uuid) == 0
    with pytest.raises(UnknownCell):
        registry.get_cell(cell.uuid)
    # The database is the operator's: left as it was.
    with connect(registry.engines.get(cell.database_url)) as conn:
        assert count_instances(conn) == 2


def test_an_empty_cell_is_removed_and_one_whose_database_is_gone_only_unread(
    registry: CellRegistry, add_cell: Callable[..., CellMapping], ops: Operations
) -> None:
    empty = add_cell("empty", hosts=())
    registry.set_disabled(empty.name, True)
    assert remove_cell(registry, empty.name).mappings == 0
    with pytest.raises(UnknownCell):
        remove_cell(registry, empty.name)
    # A mapping without a row: a build under way (or one that died): never removed...
    lonely = add_cell("lonely", hosts=())
    registry.map_instances(lonely.uuid, [("0b3a6c1e-0000-4000-8000-00000000000a", "p1", "u1")])
    registry.set_disabled(lonely.name, True)
    with pytest.raises(CellNotEmpty, match="1 instance mapped to it without a row"):
        remove_cell(registry, lonely.name, force=True)
    # ... unless the operator says its database is gone for good.
    done = remove_cell(registry, lonely.name, skip_database_check=True)
    assert (done.nodes, done.mappings) == (None, 1)
    assert registry.count_mappings(lonely.uuid) == 0


def test_a_placement_racing_the_removal_is_never_orphaned(
    registry: CellRegistry,
    add_cell: Callable[..., CellMapping],
    ops: Operations,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A boot chosen before the cell was disabled maps its instance between the checks
    and the removal's transaction (the review's reproduction): the removal is refused,
    or the boot is; a living instance is never left in an unregistered cell."""
    target = add_cell("target", hosts=("h9",))
    from cellsight.cells import cell_removal

    real = cell_removal._delete
    outcomes: list[Any] = []

    def boot_first(*args: Any) -> None:
        # The boot's scheduler chose the cell before it was disabled.
        registry.set_disabled(target.name, False)
        try:
            outcomes.append(_boot(ops, 1, cell=target.name))
        finally:
            registry.set_disabled(target.name, True)
        real(*args)

    registry.set_disabled(target.name, True)
    monkeypatch.setattr(cell_removal, "_delete", boot_first)
    with pytest.raises(CellNotEmpty, match="mappings changed meanwhile"):
        remove_cell(registry, target.name, force=True)
    assert outcomes and registry.get_cell(target.uuid).uuid == target.uuid
    assert _living(registry, target) == 1 == registry.count_mappings(target.uuid)


def test_a_placement_after_the_removal_is_refused(
    registry: CellRegistry, add_cell: Callable[..., CellMapping], ops: Operations
) -> None:
    target = add_cell("target", hosts=())
    registry.set_disabled(target.name, True)
    remove_cell(registry, target.name)
    with pytest.raises(NoValidHost, match="was removed"):
        registry.place_instances(target.uuid, [("0b3a6c1e-0000-4000-8000-00000000000b", "p", "u")])


def test_the_cli_disables_enables_and_removes_naming_what_is_left(tmp_path: Path) -> None:
    data = tmp_path / "d"
    seeded = cellsight(data, "cells", "seed", "--cells", "2", "--instances", "4")
    assert seeded.returncode == 0, seeded.stderr
    enabled_refused = cellsight(data, "cells", "remove", "cell1")
    assert_one_line_error(enabled_refused, RUNTIME, "cells disable cell1` first")
    disabled = cellsight(data, "cells", "disable", "cell1")
    assert disabled.returncode == 0 and "disabled cell cell1" in disabled.stdout
    listed = cellsight(data, "cells", "list")
    assert "True" in listed.stdout and "False" in listed.stdout
    refused = cellsight(data, "cells", "remove", "cell1", "--force")
    assert_one_line_error(refused, RUNTIME, "cell 'cell1' is not empty", "not deleted")
    unknown = cellsight(data, "cells", "remove", "nope")
    assert_one_line_error(unknown, USAGE, "unknown cell 'nope'", "cell1, cell2")
    for resource in ("instance", "node"):
        synced = cellsight(data, "index", "sync", "--type", resource)
        assert synced.returncode == 0, synced.stderr
    # A cell whose database is gone: named, with the way out.
    (data / "cells" / "cell1.db").unlink()
    gone = cellsight(data, "cells", "remove", "cell1", "--force")
    assert_one_line_error(gone, RUNTIME, "cell1.db", "--skip-database-check")
    removed = cellsight(data, "cells", "remove", "cell1", "--skip-database-check")
    assert removed.returncode == 0, removed.stderr
    assert "removed cell cell1" in removed.stdout and "index sync --type instance" in removed.stdout
    # The index held the cell's instances: the API lists by fan-out until a sync.
    engine = build_engine(load_settings(data_dir=data))
    try:
        assert not is_synced(engine, "instance") and not is_synced(engine, "node")
    finally:
        engine.close()
    enabled = cellsight(data, "cells", "enable", "cell2")
    assert enabled.returncode == 0 and "enabled cell cell2" in enabled.stdout


def test_a_removal_waits_for_no_sync(tmp_path: Path) -> None:
    """A sync that listed the cells before a removal would mark its index synced after
    it, the removed cell's documents in it: the removal is refused while one runs (exit
    3, naming it), and nothing is removed."""
    data = tmp_path / "d"
    assert cellsight(data, "cells", "seed", "--cells", "2", "--instances", "2").returncode == 0
    assert cellsight(data, "cells", "disable", "cell2").returncode == 0
    engine = build_engine(load_settings(data_dir=data))
    try:
        with MaintenanceLock(engine, "node", "sync"):
            refused = cellsight(data, "cells", "remove", "cell2", "--skip-database-check")
        assert_one_line_error(refused, LOCKED, "another node sync, verify or purge is running")
        registry = CellRegistry.from_settings(load_settings(data_dir=data))
        assert "cell2" in [c.name for c in registry.list_cells()]
        registry.close()
        done = cellsight(data, "cells", "remove", "cell2", "--skip-database-check")
        assert done.returncode == 0, done.stderr
    finally:
        engine.close()


def test_a_mapping_left_by_a_dead_build_is_removed_with_force_once_old(
    registry: CellRegistry, add_cell: Callable[..., CellMapping]
) -> None:
    """A crash probe: a boot or reservation killed between its mapping (API database)
    and its cell transaction left a mapping without a row, which refused the removal
    for ever as "being built"."""
    target = add_cell("target", hosts=())
    orphan = "0b3a6c1e-0000-4000-8000-00000000000c"
    registry.place_instances(target.uuid, [(orphan, "p1", "u1")])
    registry.set_disabled(target.name, True)
    with pytest.raises(CellNotEmpty, match="being built"):
        remove_cell(registry, target.name, force=True)  # a build may still be under way
    m = instance_mappings.c
    with write_transaction(registry.api_engine) as conn:
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
        conn.execute(
            instance_mappings.update()
            .where(m.instance_uuid == orphan)
            .values(created_at=an_hour_ago)
        )
    with pytest.raises(CellNotEmpty, match="left by builds that did not finish") as refused:
        remove_cell(registry, target.name)
    assert "being built" not in str(refused.value)
    removed = remove_cell(registry, target.name, force=True)
    assert removed.mappings == 1 and registry.count_mappings(target.uuid) == 0
