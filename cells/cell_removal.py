"""Removing a cell from the registry, as Nova's ``nova-manage cell_v2 delete_cell``
decides it: a cell that holds living instances (not deleted; reservations included) is
never removed; one with compute nodes, or with mappings of deleted instances, only with
``force``, which removes those mappings with it. The cell's database is left as it is:
it is the operator's, and Cellsight only stops reading it.

Unlike Nova, the cell must be disabled first (``cells disable``), and the removal is one
transaction of the API database that holds the cell's row under an exclusive lock and
removes only the mappings it checked: a placement takes that row under a shared lock
(``CellRegistry.place_instances``), so none lands in a cell being removed, and a build
that was mapped before the checks but has no row yet (still being built) refuses the
removal, unless it was mapped longer ago than any build takes: a build killed between its
mapping and its cell transaction leaves such a mapping for ever, which ``force``
removes with the cell. ``skip_database_check`` is for a cell whose database is gone
for good: nothing is read there, and every instance mapped to it is unmapped, living or
not.

What the index holds of the cell (its deleted instances' documents, its nodes) stays
until ``index sync`` rebuilds without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from cellsight.cells.database import connect, write_transaction
from cellsight.cells.errors import CellEnabled, CellNotEmpty
from cellsight.cells.leftovers import dead_before, dead_build_age
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.reads import IN_CHUNK, count_instances, deleted_flags, list_compute_nodes
from cellsight.cells.schema import cell_mappings, instance_mappings
from cellsight.notifications.errors import plural


@dataclass(frozen=True)
class Removal:
    cell: CellMapping
    nodes: int | None  # compute nodes left in its database; None: not read
    mappings: int  # instance mappings removed with it


def remove_cell(
    registry: CellRegistry,
    ref: str,
    *,
    force: bool = False,
    skip_database_check: bool = False,
    before_removal: Callable[[CellMapping], None] = lambda cell: None,
) -> Removal:
    """Raises ``UnknownCell``, ``CellNotEmpty`` naming every reason at once, or
    ``DatabaseUnavailable`` when the cell's database cannot be read (what it holds cannot
    be known then: ``skip_database_check`` removes it unread). ``before_removal`` runs
    once the cell may go, before it goes (what must not be skipped by an interrupt)."""
    cell = registry.get_cell(ref)
    if not cell.disabled:
        raise CellEnabled(cell.name)
    with connect(registry.api_engine) as conn:
        mapped = _mapped(conn, cell.uuid)
    nodes: int | None = None
    if not skip_database_check:
        blockers, nodes = _what_it_holds(registry, cell, mapped, force)
        if blockers:
            raise CellNotEmpty(cell.name, "; ".join(blockers))
    before_removal(cell)
    _delete(registry, cell, mapped)
    return Removal(cell, nodes, len(mapped))


def _mapped(conn: sa.Connection, cell_uuid: str, *, before: datetime | None = None) -> set[str]:
    """The uuids of the instances mapped to the cell (``before``: mapped before then)."""
    m = instance_mappings.c
    query = sa.select(m.instance_uuid).where(m.cell_uuid == cell_uuid)
    if before is not None:
        query = query.where(m.created_at < before)
    return {str(u) for (u,) in conn.execute(query)}


def _what_it_holds(
    registry: CellRegistry, cell: CellMapping, mapped: set[str], force: bool
) -> tuple[list[str], int]:
    with connect(registry.cell_engine(cell)) as conn:
        living = count_instances(conn, include_deleted=False)
        nodes = len(list_compute_nodes(conn))
        rows = deleted_flags(conn, sorted(mapped))
    blockers = []
    if living:
        blockers.append(f"{plural(living, 'instance')} not deleted")
    rowless = mapped - set(rows)
    with connect(registry.api_engine) as conn:
        dead = _mapped(conn, cell.uuid, before=dead_before(registry)) & rowless
    if building := len(rowless - dead):
        blockers.append(
            f"{plural(building, 'instance')} mapped to it without a row (being built: try "
            "again once builds have finished)"
        )
    if dead and not force:
        blockers.append(
            f"{plural(len(dead), 'instance')} mapped to it without a row for over "
            f"{dead_build_age(registry).total_seconds() // 60:.0f} minutes, left by builds "
            "that did not finish "
            "(--force removes them with it)"
        )
    if not force:
        if nodes:
            blockers.append(f"{plural(nodes, 'compute node')} (--force removes it anyway)")
        gone = sum(rows.values())
        if gone:
            blockers.append(
                f"{plural(gone, 'mapping')} of deleted instances (--force removes them with it)"
            )
    return blockers, nodes


def _delete(registry: CellRegistry, cell: CellMapping, mapped: set[str]) -> None:
    """The checked mappings and the cell, under the cell row's exclusive lock; refused if
    the cell was enabled again or another instance was mapped to it meanwhile."""
    m = instance_mappings.c
    with write_transaction(registry.api_engine) as conn:
        row = conn.execute(
            sa.select(cell_mappings.c.disabled)
            .where(cell_mappings.c.uuid == cell.uuid)
            .with_for_update()
        ).first()
        if row is None:
            return  # another removal was first: the outcome asked for
        if not row.disabled:
            raise CellNotEmpty(cell.name, "it was enabled again meanwhile")
        if _mapped(conn, cell.uuid) != mapped:
            raise CellNotEmpty(cell.name, "its instance mappings changed meanwhile: try again")
        ordered = sorted(mapped)
        for start in range(0, len(ordered), IN_CHUNK):
            conn.execute(
                instance_mappings.delete().where(
                    m.instance_uuid.in_(ordered[start : start + IN_CHUNK])
                )
            )
        conn.execute(cell_mappings.delete().where(cell_mappings.c.uuid == cell.uuid))
