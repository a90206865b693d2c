"""Removing a cell from the registry, as Nova's ``nova-manage cell_v2 delete_cell``
decides it: a cell that holds living instances (not deleted; reservations included) is
never removed; one with compute nodes, or with mappings of deleted instances, only with
``force``, which removes those mappings with it. The cell's database is left as it is:
it is the operator's, and Cellsight only stops reading it.

What the index holds of the cell (its deleted instances' tombstones, its nodes) stays
until ``index sync`` rebuilds without it; disable the cell first so that nothing is
placed there between the checks and the removal.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellsight.cells.database import connect
from cellsight.cells.errors import CellNotEmpty
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.reads import count_instances, list_compute_nodes


@dataclass(frozen=True)
class Removal:
    cell: CellMapping
    nodes: int  # compute nodes left in its database (``force``)
    mappings: int  # instance mappings removed with it (of deleted instances)


def remove_cell(registry: CellRegistry, ref: str, *, force: bool = False) -> Removal:
    """Raises ``UnknownCell``, ``CellNotEmpty``, or ``DatabaseUnavailable`` when the
    cell's database cannot be read (what it holds cannot be known then)."""
    cell = registry.get_cell(ref)
    with connect(registry.cell_engine(cell)) as conn:
        living = count_instances(conn, include_deleted=False)
        nodes = len(list_compute_nodes(conn))
    if living:
        raise CellNotEmpty(cell.name, f"{living} instances are not deleted")
    mapped = registry.count_mappings(cell.uuid)
    if not force:
        if nodes:
            raise CellNotEmpty(
                cell.name, f"{nodes} compute nodes (--force removes it all the same)"
            )
        if mapped:
            raise CellNotEmpty(
                cell.name,
                f"{mapped} mappings of deleted instances (--force removes them with it)",
            )
    removed = registry.delete_cell_mapping(cell.uuid)
    return Removal(cell, nodes, removed)
