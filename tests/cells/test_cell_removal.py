"""Disabling and removing a cell, on every dialect: Nova's ``update_cell --disable`` and
``delete_cell`` rules (living instances always refuse; nodes and the mappings of deleted
instances refuse without ``force``), and the CLI's one-line answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cellsight.cells.cell_removal import remove_cell
from cellsight.cells.database import connect
from cellsight.cells.errors import CellNotEmpty, NoValidHost, UnknownCell
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.reads import count_instances
from cellsight.cli.errors import RUNTIME, USAGE
from tests.cli.test_cli_errors import assert_one_line_error, cellsight


def _boot(ops: Operations, count: int = 2) -> list[str]:
    made = ops.boot(BootRequest("web", "m1.small", "p1", "u1", count=count))
    return [p.uuid for p in made.instances]


def test_a_disabled_cell_takes_no_new_instance_and_keeps_its_own(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    (kept,) = _boot(ops, 1)
    assert registry.set_disabled(cell.name, True).disabled
    assert registry.list_cells(include_disabled=False) == []
    with pytest.raises(NoValidHost):
        _boot(ops, 1)
    ops.power_off(kept)  # its instances are changed as before
    assert [c.uuid for c in registry.list_cells()] == [cell.uuid]  # and listed
    assert not registry.set_disabled(cell.uuid, False).disabled
    assert len(_boot(ops, 1)) == 1


def test_a_cell_with_living_instances_is_never_removed(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    _boot(ops)
    for force in (False, True):
        with pytest.raises(CellNotEmpty, match="2 instances are not deleted"):
            remove_cell(registry, cell.name, force=force)
    assert registry.get_cell(cell.uuid) == cell
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
    with pytest.raises(CellNotEmpty, match="3 compute nodes"):
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


def test_mappings_of_deleted_instances_alone_need_force(
    registry: CellRegistry, add_cell: Callable[..., CellMapping], ops: Operations
) -> None:
    empty = add_cell("empty", hosts=())
    assert remove_cell(registry, empty.name).mappings == 0  # an empty cell: removed
    with pytest.raises(UnknownCell):
        remove_cell(registry, empty.name)
    lonely = add_cell("lonely", hosts=())
    registry.map_instances(lonely.uuid, [("0b3a6c1e-0000-4000-8000-00000000000a", "p1", "u1")])
    with pytest.raises(CellNotEmpty, match="1 mappings of deleted instances"):
        remove_cell(registry, lonely.name)
    assert remove_cell(registry, lonely.name, force=True).mappings == 1


def test_the_cli_disables_enables_and_removes_naming_what_is_left(tmp_path: Path) -> None:
    data = tmp_path / "d"
    seeded = cellsight(data, "cells", "seed", "--cells", "2", "--instances", "4")
    assert seeded.returncode == 0, seeded.stderr
    disabled = cellsight(data, "cells", "disable", "cell1")
    assert disabled.returncode == 0 and "disabled cell cell1" in disabled.stdout
    listed = cellsight(data, "cells", "list")
    assert "True" in listed.stdout and "False" in listed.stdout
    refused = cellsight(data, "cells", "remove", "cell1", "--force")
    assert_one_line_error(refused, RUNTIME, "cell 'cell1' is not empty", "not deleted")
    unknown = cellsight(data, "cells", "remove", "nope")
    assert_one_line_error(unknown, USAGE, "unknown cell 'nope'", "cell1, cell2")
    enabled = cellsight(data, "cells", "enable", "cell1")
    assert enabled.returncode == 0 and "enabled cell cell1" in enabled.stdout
