"""The embedded index's secondary indexes as the layout before 2026-11-24 declared them
(``sqlite_schema`` says why it changed): what ``Catalog.update_indexes`` migrates from,
for the tests and the benchmarks that build such an index."""

from __future__ import annotations

import sqlite3

from cellsight.indexer.engines.sqlite_schema import INDEXED_COLUMNS, index_name, quote

EARLIER_LAYOUT: dict[str, list[tuple[str, ...]]] = {
    "instance": [
        ("cell_uuid", "id", "version"),
        ("created_at", "id"),
        ("tenant_id", "created_at", "id"),
        ("updated_at", "id"),
        ("user_id",),
        ("host",),
        ("node",),
        ("state", "created_at", "id"),
        ("display_name",),
    ],
    "node": [("cell_uuid", "id", "version"), ("host",), ("hypervisor_hostname",), ("updated_at",)],
}


def use_earlier_layout(conn: sqlite3.Connection, index: str, resource: str = "instance") -> None:
    """Swap the secondary indexes of ``index``'s table for the earlier layout's, as an
    index made by the earlier version has them (the side table's index is the same)."""
    for columns in INDEXED_COLUMNS[resource]:
        conn.execute(f"DROP INDEX IF EXISTS {quote(index_name(index, columns))}")
    for columns in EARLIER_LAYOUT[resource]:
        listed = ", ".join(quote(c) for c in columns)
        conn.execute(
            f"CREATE INDEX {quote(index_name(index, columns))} ON {quote(index)} ({listed})"
        )
