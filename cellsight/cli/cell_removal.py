"""``cellsight cells remove``'s side in the index: the serving indexes hold the removed
cell's documents, which the fan-out no longer lists, so they are marked unsynced
(``index_marks``: the API lists by fan-out until ``index sync`` rebuilds without it)."""

from __future__ import annotations

from cellsight.cells.cell_removal import Removal, remove_cell
from cellsight.cells.errors import DatabaseUnavailable
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cli.context import fail
from cellsight.cli.errors import RUNTIME
from cellsight.cli.index_marks import index_held, unmark_all
from cellsight.settings import Settings

LEAVES = "its listings hold the removed cell's instances"


def remove_unsynced(
    settings: Settings,
    registry: CellRegistry,
    cell: str,
    *,
    force: bool,
    skip_database_check: bool,
) -> Removal:
    with index_held(settings, "cell removal", LEAVES) as engine:

        def unmark(gone: CellMapping) -> None:
            # Before the removal, which an interrupt could otherwise end with the index
            # marked synced, holding the removed cell's documents (an interrupt probe,
            # then a review). Should the removal fail, a sync marks it synced again.
            unmark_all(engine, f"cell {gone.name} ({gone.uuid}) removed", LEAVES)

        try:
            return remove_cell(
                registry, cell, force=force, skip_database_check=skip_database_check,
                before_removal=unmark,
            )  # fmt: skip
        except DatabaseUnavailable as exc:
            fail(
                f"{exc.message}: what cell {cell!r} holds cannot be read "
                "(--skip-database-check removes it unread)",
                code=RUNTIME,
            )
