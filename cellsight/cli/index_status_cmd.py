"""``cellsight index status``: indexes and aliases, synced marker, lock, per-cell counts
against the cells, and the last sync's and verify's figures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from cellsight.cli.context import console, fail, print_table, require_data_dir

if TYPE_CHECKING:
    from cellsight.cells.mappings import CellRegistry
    from cellsight.indexer.engines.base import SearchEngine
    from cellsight.settings import Settings


def collect(engine: Any, registry: Any, resource: str) -> dict[str, Any]:
    from cellsight.cells.database import connect
    from cellsight.indexer.cell_streams import count_rows, scope_of
    from cellsight.indexer.index_roles import (
        LAST_SYNC,
        LAST_VERIFY,
        describe_indexes,
        is_synced,
        marker_key,
    )
    from cellsight.indexer.lock import describe, is_free, lock_key

    marker = engine.get_meta(marker_key(resource))
    lock = engine.get_meta(lock_key(resource))
    scope = scope_of(engine, resource, registry)
    cells = []
    for cell in registry.list_cells():
        entry: dict[str, Any] = {"name": cell.name, "uuid": cell.uuid}
        # Both sides' failures are shown: the index's (none built yet) must not hide the
        # cell's (its database gone).
        errors: list[str] = []
        try:
            with connect(registry.cell_engine(cell)) as conn:
                entry["rows"] = count_rows(conn, scope)
        except Exception as exc:
            entry["rows"] = None
            errors.append(str(exc))
        try:
            entry["documents"] = engine.count(resource, cell.uuid)
        except Exception as exc:
            entry["documents"] = None
            errors.append(str(exc))
        if errors:
            entry["error"] = "; ".join(errors)
        cells.append(entry)
    held = not is_free(lock, datetime.now(UTC))
    return {
        "resource": resource,
        "read_alias": engine.read_alias(resource),
        "write_alias": engine.write_alias(resource),
        "indexes": describe_indexes(engine, resource),
        "synced": is_synced(engine, resource),
        "marker": marker,
        "lock": {"held": held, "by": describe(lock) if held else None},
        "cells": cells,
        "last_sync": engine.get_meta(LAST_SYNC.format(resource=resource)),
        "last_verify": engine.get_meta(LAST_VERIFY.format(resource=resource)),
    }


@contextmanager
def clients(
    settings: Settings, *, patient: bool = False
) -> Iterator[tuple[SearchEngine, CellRegistry]]:
    """The engine and the cells, closed afterwards (their errors reach the CLI boundary);
    ``patient``: see ``cellsight.clients.build_engine``."""
    from cellsight.cells.mappings import CellRegistry
    from cellsight.clients import build_engine

    engine = build_engine(settings, patient=patient)
    try:
        registry = CellRegistry.from_settings(settings)
    except BaseException:
        engine.close()
        raise
    try:
        yield engine, registry
    finally:
        engine.close()
        registry.close()


def index_status(
    ctx: typer.Context,
    resource: Annotated[
        str | None, typer.Option("--type", help="instance or node (default: both)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """The indexes, aliases, synced marker and lock; documents per cell against the
    cells' rows; the last sync's and verify's figures."""
    if resource not in (None, "instance", "node"):
        fail(f"--type {resource!r}: must be instance or node")
    names = [resource] if resource else ["instance", "node"]
    # read-only: a missing index shows as such rather than being created
    with clients(require_data_dir(ctx, registry=True, engine=True)) as (engine, registry):
        data = [collect(engine, registry, name) for name in names]
    if as_json:
        print(json.dumps(data, indent=2, default=str))
        return
    for status in data:
        _print(status)


def _print(status: dict[str, Any]) -> None:
    from rich.table import Table

    resource = status["resource"]
    table = Table("index", "role", "documents", "read", "write", "created", title=resource)
    for i in status["indexes"]:
        table.add_row(
            escape(i["name"]), i["role"], f"{i['documents']:,}", "✓" if i["read_alias"] else "",
            "✓" if i["write_alias"] else "", i["created_at"],
        )  # fmt: skip
    print_table(table)
    marker = status["marker"]
    if status["synced"]:
        console.print(f"synced: yes ({marker['index']} at {marker['finished_at']})")
    elif marker and marker.get("cleared"):
        # A change to the set of cells (``cli.index_marks``): the API fans out until a sync.
        console.print(
            f"synced: no ({marker['cleared']} at {marker.get('at')}: the API answers from "
            "the cells until `cellsight index sync`)",
            highlight=False,
        )
    elif marker:
        console.print(f"synced: no (the marker names {marker.get('index')}, which does not serve)")
    else:
        console.print("synced: no (never fully synced: the API answers from the cells)")
    lock = status["lock"]
    console.print(f"lock: {'held by ' + lock['by'] if lock['held'] else 'free'}", highlight=False)
    cells = Table("cell", "rows", "documents", "difference", title=f"{resource} per cell")
    for c in status["cells"]:
        rows, docs = c.get("rows"), c.get("documents")
        diff = "" if rows is None or docs is None else f"{docs - rows:+,}" if docs != rows else "="
        cells.add_row(escape(c["name"]), _n(rows), _n(docs), escape(c.get("error") or diff))
    print_table(cells)
    last = status["last_sync"]
    if last:
        rate = f"{last.get('docs_per_s', 0):,} docs/s"
        console.print(
            f"last sync: {last.get('mode')} {last.get('finished_at')}: "
            f"{last.get('rows', 0):,} rows in {last.get('seconds')} s ({rate}), "
            f"index {last.get('index')}",
            highlight=False,
        )
    verify = status["last_verify"]
    if verify:
        console.print(
            f"last verify: {verify.get('started_at')}: drift {verify.get('drift')} in "
            f"{verify.get('seconds')} s{' (repaired)' if verify.get('repair') else ''}",
            highlight=False,
        )


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
