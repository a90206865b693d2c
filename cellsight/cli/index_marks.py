"""The serving indexes' side of a change to the set of cells: registering a cell that
holds instances (``cells add`` of an existing database, ``cells seed`` without
``--notify``) or removing one leaves the index answering for other cells than the
fan-out lists, so it is marked unsynced and the API lists by fan-out until ``index
sync`` rebuilds it.

The change holds the instance and node maintenance locks meanwhile: a sync that listed
the cells before it would otherwise mark its index synced afterwards, without the new
cell or with the removed one (exit 3 while a sync, verify or purge runs). With the
engine unreachable the change goes on without them, and a warning says what that
leaves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from rich.markup import escape

from cellsight.cli.context import err_console
from cellsight.clients import build_engine
from cellsight.indexer.engines.base import RESOURCES, EngineError, SearchEngine
from cellsight.indexer.index_roles import unmark
from cellsight.indexer.lock import MaintenanceLock
from cellsight.settings import Settings


@contextmanager
def index_held(settings: Settings, what: str, leaves: str) -> Iterator[SearchEngine | None]:
    """The engine with both maintenance locks held for ``what``, or None (warned, with
    ``leaves``: what the listings hold until the next sync) if it cannot be reached."""
    with ExitStack() as stack:
        engine: SearchEngine | None = None
        try:
            engine = build_engine(settings)
            stack.callback(engine.close)
            for resource in RESOURCES:
                # LockHeld escapes: the CLI's boundary makes it exit 3, naming the holder.
                stack.enter_context(MaintenanceLock(engine, resource, what))
        except EngineError as exc:
            warn(f"the index cannot be reached ({exc})", leaves)
            engine = None
        yield engine


def unmark_all(engine: SearchEngine | None, why: str, leaves: str) -> None:
    """Every resource's serving index unsynced (``why``), or a warning that it is not."""
    if engine is None:
        return
    try:
        for resource in RESOURCES:
            unmark(engine, resource, why)
    except EngineError as exc:
        warn(f"the index could not be marked unsynced ({exc})", leaves)


def warn(what: str, leaves: str) -> None:
    err_console.print(
        f"[yellow]warning:[/] {escape(what)}: until `cellsight index sync`, {escape(leaves)}",
        highlight=False,
        soft_wrap=True,
    )
