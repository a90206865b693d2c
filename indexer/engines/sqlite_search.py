"""Search on the embedded index: the tree compiled to SQL over one concrete index.

The resolver maps a field to its column in ``"<index>"`` (named like the field; dates
as epoch microseconds, booleans as 0/1, see ``sqlite_schema``) or, for multi-valued
fields, to an EXISTS over ``"<index>#many"`` rows of that field (which its
``(field, value)`` index serves). SQLite's BINARY collation compares UTF-8 bytes, which
is code-point order, as the tree requires.

Each search has a deadline: a progress handler interrupts the statement past it, and
the ``REGEXP`` function refuses to start another match past it (one ``re`` call cannot
be interrupted). A timed-out search is ``EngineUnavailable``, like an overloaded
cluster, so the API can fall back to the cells.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from indexer.engines.base import EngineUnavailable, StoredDocument
from indexer.engines.sqlite_schema import Schema
from indexer.fields import DocField, Kind
from indexer.query.prepare import QueryError, prepare
from indexer.query.sql import Column, Condition, Many, Resolved, SqlCompiler
from indexer.query.sqlite_regexp import Deadline, install
from indexer.query.tree import SearchRequest

_DIALECT = sqlite.dialect()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TYPES: dict[Kind, Any] = {
    Kind.KEYWORD: sa.String(),
    Kind.TEXT: sa.String(),
    Kind.IP: sa.String(),
    Kind.LONG: sa.BigInteger(),
    Kind.DATE: sa.BigInteger(),
    Kind.BOOLEAN: sa.Integer(),
    Kind.DOUBLE: sa.Float(),
}
# SQLite VM instructions between two deadline checks: cheap, and a few ms apart.
_PROGRESS_STEPS = 20_000


def micros(value: datetime) -> int:
    """An aware date as the embedded index stores it: epoch microseconds."""
    return (value - _EPOCH) // timedelta(microseconds=1)


class EmbeddedColumns:
    """The ``Resolver`` of one concrete embedded index."""

    dialect = "sqlite"

    def __init__(self, schema: Schema, index: str) -> None:
        self.schema = schema
        columns = [sa.column(f.name, _TYPES[f.kind]) for f in schema.columns]
        self.table = sa.table(
            index,
            sa.column("rid", sa.Integer()),
            sa.column("id", sa.String()),
            sa.column("version", sa.BigInteger()),
            *columns,
        )
        self.docs = sa.table(f"{index}#doc", sa.column("rid", sa.Integer()), sa.column("doc"))
        self.many = sa.table(
            f"{index}#many",
            sa.column("rid", sa.Integer()),
            sa.column("field", sa.String()),
            sa.column("value", sa.String()),
        ).alias("m")

    def resolve(self, field: DocField) -> Resolved:
        if field.many and field.kind is not Kind.OBJECT:
            return Many(lambda predicate: self._any(field.name, predicate), field.kind)
        if field.name == "version":
            return Column(self.table.c.version, Kind.LONG, nullable=False)
        if field.name not in self.table.c or field.kind is Kind.OBJECT:
            raise QueryError(f"field {field.name!r} has no column in the embedded index")
        bind = micros if field.kind is Kind.DATE else int if field.kind is Kind.BOOLEAN else None
        return Column(self.table.c[field.name], field.kind, bind=bind)

    def _any(self, name: str, predicate: Any) -> Condition:
        m = self.many
        return sa.exists().where(
            m.c.rid == self.table.c.rid, m.c.field == name, predicate(m.c.value)
        )


def _sql(statement: sa.Select[Any]) -> tuple[str, list[Any]]:
    # IN lists expanded in place, so the SQL and its positional parameters are final
    compiled = statement.compile(dialect=_DIALECT, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    return str(compiled), [params[name] for name in compiled.positiontup or ()]


def search(
    conn: sqlite3.Connection, schema: Schema, index: str, request: SearchRequest, timeout: float
) -> list[StoredDocument]:
    """One page of ``request`` from ``index``, inside the caller's read transaction."""
    columns = EmbeddedColumns(schema, index)
    node, order = prepare(request, schema.resource)
    compiler = SqlCompiler(columns, schema.fields)
    t, d = columns.table, columns.docs
    statement = (
        sa.select(t.c.id, t.c.version, d.c.doc)
        .select_from(t.join(d, d.c.rid == t.c.rid))
        .where(compiler.where(node))
        .order_by(*compiler.order_by(order))
        .limit(request.limit)
    )
    sql, params = _sql(statement)
    rows = _run(conn, sql, params, timeout)
    return [StoredDocument(i, v, json.loads(doc)) for i, v, doc in rows]


def _run(conn: sqlite3.Connection, sql: str, params: list[Any], timeout: float) -> list[Any]:
    deadline = Deadline()
    deadline.arm(timeout)
    install(conn, deadline)
    conn.set_progress_handler(lambda: time.monotonic() > deadline.at, _PROGRESS_STEPS)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if deadline.expired or time.monotonic() > deadline.at:
            raise EngineUnavailable(f"embedded search ran past {timeout:g} s") from exc
        raise
    finally:
        conn.set_progress_handler(None, 0)


def iter_tombstones(
    conn: sqlite3.Connection, index: str, deleted_before: datetime, batch_size: int = 1000
) -> Iterator[str]:
    """Ids of deleted documents whose ``deleted_at`` is before ``deleted_before``,
    keyset-paged by id, one short statement per batch (no snapshot held between)."""
    if deleted_before.tzinfo is None:
        deleted_before = deleted_before.replace(tzinfo=UTC)
    table = '"' + index.replace('"', '""') + '"'
    sql = (
        f"SELECT id FROM {table} WHERE deleted = 1 AND deleted_at < ? AND id > ? "
        "ORDER BY id LIMIT ?"
    )
    before, last = micros(deleted_before.astimezone(UTC)), ""
    while True:
        batch = [doc_id for (doc_id,) in conn.execute(sql, (before, last, batch_size))]
        yield from batch
        if len(batch) < batch_size:
            return
        last = batch[-1]
