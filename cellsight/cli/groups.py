"""Every command and group of ``cellsight``, registered here and nowhere else.

To add a group: write it in its own module as a ``typer.Typer`` (importing only Typer
at the top) and add one line to ``GROUPS``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

import typer

# name on the command line -> "module:attribute" of its Typer app
GROUPS: dict[str, str] = {
    "notifications": "cellsight.cli.notifications_cmd:app",
    "cells": "cellsight.cli.cells_cmd:app",
    "ops": "cellsight.cli.ops_cmd:app",
    "dlq": "cellsight.cli.indexer_cmd:dlq_app",
    "outbox": "cellsight.cli.outbox_cmd:app",
    "query": "cellsight.cli.query_cmd:app",
    "nodes": "cellsight.cli.query_cmd:nodes_app",
}

# commands added to a group from another module: group -> "module:register(group_app)"
EXTENSIONS: dict[str, str] = {
    "ops": "cellsight.cli.reserve_cmd:register",
}

# single commands: name -> "module:function"
COMMANDS: dict[str, str] = {
    "indexer": "cellsight.cli.indexer_cmd:run_indexer",
    "api": "cellsight.cli.api_cmd:serve",
    "demo": "cellsight.cli.demo_cmd:demo",
}

# ``cellsight index …`` gathers commands from three modules.
INDEX_COMMANDS: dict[str, str] = {
    "get": "cellsight.cli.indexer_cmd:index_get",
    "purge": "cellsight.cli.indexer_cmd:index_purge",
    "sync": "cellsight.cli.index_sync_cmd:index_sync",
    "verify": "cellsight.cli.index_sync_cmd:index_verify",
    "status": "cellsight.cli.index_status_cmd:index_status",
}


def _load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(import_module(module), attribute)


def register(app: typer.Typer) -> None:
    """Add every group and command to ``app`` (once; calling it again does nothing)."""
    if getattr(app, "_cellsight_registered", False):
        return
    for name, target in GROUPS.items():
        group = _load(target)
        assert isinstance(group, typer.Typer)
        if name in EXTENSIONS:
            _load(EXTENSIONS[name])(group)
        app.add_typer(group, name=name)
    index = typer.Typer(help="Operate the search indexes.", no_args_is_help=True)
    for name, target in INDEX_COMMANDS.items():
        index.command(name)(_load(target))
    app.add_typer(index, name="index")
    for name, target in COMMANDS.items():
        app.command(name)(_load(target))
    app._cellsight_registered = True  # type: ignore[attr-defined]
