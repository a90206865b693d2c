"""Bulk loading: rows as tuples straight to the driver's ``executemany``.

Values must already be in the driver's form: JSON columns as JSON text, booleans as
``bool``, times as naive UTC datetimes, or on SQLite as the text SQLAlchemy itself
writes (``YYYY-MM-DD HH:MM:SS.ffffff``, fixed width, so text order is time order).
psycopg pipelines an ``executemany`` and PyMySQL turns it into multi-row INSERTs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import connect

MAPPING_COLUMNS = (
    "instance_uuid",
    "cell_uuid",
    "project_id",
    "user_id",
    "queued_for_delete",
    "created_at",
    "updated_at",
)

# Durability is pointless while loading a database that did not exist before.
SQLITE_BULK_PRAGMAS = {
    "synchronous": "OFF",
    "cache_size": "-262144",
    "temp_store": "MEMORY",
    "mmap_size": "1073741824",
}
SQLITE_NORMAL_PRAGMAS = {
    "synchronous": "NORMAL",
    "cache_size": "-2000",
    "temp_store": "DEFAULT",
    "mmap_size": "0",
}


def _json_columns(table: sa.Table) -> set[str]:
    return {c.name for c in table.columns if isinstance(c.type, sa.JSON)}


def insert_sql(dialect: sa.engine.Dialect, table: sa.Table, columns: Sequence[str]) -> str:
    quote = dialect.identifier_preparer.quote
    if dialect.name == "sqlite":
        marks = ["?"] * len(columns)
    elif dialect.name == "postgresql":
        json_columns = _json_columns(table)
        marks = ["%s::jsonb" if name in json_columns else "%s" for name in columns]
    else:
        marks = ["%s"] * len(columns)
    return (
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES ({', '.join(marks)})"
    )


def insert(
    conn: sa.Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    if rows:
        conn.exec_driver_sql(insert_sql(conn.dialect, table, columns), list(rows))


def _pragmas(conn: sa.Connection, pragmas: dict[str, str]) -> None:
    # On the driver connection: outside SQLAlchemy's transaction (the sqlite3 module
    # is in autocommit mode, see database.py), where SQLite applies them.
    raw = conn.connection.driver_connection
    assert raw is not None
    for name, value in pragmas.items():
        raw.execute(f"PRAGMA {name}={value}")


@contextmanager
def loading(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One connection for a bulk load; begin a transaction per chunk with ``conn.begin()``.

    On SQLite the connection runs with bulk-load PRAGMAs, restored before it returns
    to the pool, and its transactions start with ``BEGIN IMMEDIATE``.
    """
    with connect(engine) as conn:
        if engine.dialect.name != "sqlite":
            yield conn
            return
        _pragmas(conn, SQLITE_BULK_PRAGMAS)
        try:
            yield conn.execution_options(sqlite_begin="IMMEDIATE")
        finally:
            if conn.in_transaction():
                conn.rollback()
            _pragmas(conn, SQLITE_NORMAL_PRAGMAS)
