"""``cellsight cells remove``'s side in the index: the serving indexes hold the removed
cell's documents, which the fan-out no longer lists, so they are marked unsynced (the
API lists by fan-out until ``index sync`` rebuilds without the cell).

The removal holds the instance and node maintenance locks meanwhile: a sync that listed
the cells before the removal would otherwise mark its index synced afterwards, the
removed cell's documents in it (exit 3 while a sync, verify or purge runs). With the
engine unreachable the removal goes on without them, and a warning says what that
leaves.
"""

from __future__ import annotations

from contextlib import ExitStack

from rich.markup import escape

from cellsight.cells.cell_removal import Removal, remove_cell
from cellsight.cells.errors import DatabaseUnavailable
from cellsight.cells.mappings import CellRegistry
from cellsight.cli.context import err_console, fail
from cellsight.cli.errors import RUNTIME
from cellsight.clients import build_engine
from cellsight.indexer.engines.base import RESOURCES, EngineError, SearchEngine
from cellsight.indexer.index_roles import unmark
from cellsight.indexer.lock import MaintenanceLock
from cellsight.settings import Settings


def remove_unsynced(
    settings: Settings,
    registry: CellRegistry,
    cell: str,
    *,
    force: bool,
    skip_database_check: bool,
) -> Removal:
    with ExitStack() as stack:
        engine: SearchEngine | None = None
        try:
            engine = build_engine(settings)
            stack.callback(engine.close)
            for resource in RESOURCES:
                # LockHeld escapes: the CLI's boundary makes it exit 3, naming the holder.
                stack.enter_context(MaintenanceLock(engine, resource, "cell removal"))
        except EngineError as exc:
            _warn(f"the index cannot be reached ({exc})")
            engine = None
        try:
            done = remove_cell(registry, cell, force=force, skip_database_check=skip_database_check)
        except DatabaseUnavailable as exc:
            fail(
                f"{exc.message}: what cell {cell!r} holds cannot be read "
                "(--skip-database-check removes it unread)",
                code=RUNTIME,
            )
        if engine is not None:
            why = f"cell {done.cell.name} ({done.cell.uuid}) removed"
            try:
                for resource in RESOURCES:
                    unmark(engine, resource, why)
            except EngineError as exc:
                _warn(f"the index could not be marked unsynced ({exc})")
        return done


def _warn(what: str) -> None:
    err_console.print(
        f"[yellow]warning:[/] {escape(what)}: until `cellsight index sync`, its listings "
        "hold the removed cell's instances",
        highlight=False,
        soft_wrap=True,
    )
