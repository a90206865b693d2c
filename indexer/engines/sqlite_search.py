"""Search on the embedded index: the tree compiled to SQL over one concrete index.

The resolver maps a field to its column in ``"<index>"`` (named like the field; dates
as epoch microseconds, booleans as 0/1, see ``sqlite_schema``) or, for multi-valued
fields, to an EXISTS over ``"<index>#many"`` rows of that field (which its
``(field, value)`` index serves). SQLite's BINARY collation compares UTF-8 bytes, which
is code-point order, as the tree requires.

Each search has a deadline: a progress handler interrupts the statement past it, and
the ``REGEXP`` function refuses to start another match past it (one ``re`` call cannot
be interrupted). A timed-out search is ``EngineTimeout``, like a cluster's, so the API
can fall back to the cells.

Plans. A page is ``WHERE filter ORDER BY keys LIMIT n``; it is fast when SQLite walks
an index in the sort order and stops after n matching rows, and slow when it reads every
row the filter's index yields and sorts them: SQLite's planner does not count on the
LIMIT ending a walk early, and without per-value statistics (no STAT4 in Python's
SQLite) it cannot tell ``state = 'active'`` (three quarters of the rows) from
``state = 'rescued'`` (none). ``search`` therefore tries the walk first when the
planner's plan would sort many rows, for a bounded time (see ``_walk_index``); the
keyset's range bound (``tree.after``), the ``(state, created_at)`` index
(``sqlite_schema``) and fetching documents for the page's rows only cover the rest.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import TableClause

from cellsight.indexer.engines.base import EngineTimeout, StoredDocument
from cellsight.indexer.engines.sqlite_rows import decode_json
from cellsight.indexer.engines.sqlite_schema import Schema, doc_table, order_index
from cellsight.indexer.fields import DocField, Kind
from cellsight.query.prepare import QueryError, prepare
from cellsight.query.sql import Column, Condition, Many, Resolved, SqlCompiler
from cellsight.query.sqlite_regexp import Deadline, install
from cellsight.query.tree import Node, SearchRequest, SortKey
from cellsight.sqlite_interrupts import signalled

log = logging.getLogger(__name__)
_T = TypeVar("_T")
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
# The ordered walk (``_walk_index``): tried when the planner's plan would sort more than
# this many rows per requested row, for at most this long (then the planner's plan runs).
WALK_ROWS_PER_RESULT = 20
WALK_BUDGET_S = 0.1
_WALK_STEPS = 1_000  # finer deadline checks while walking: a walk is cut near its budget
_SORTS_ALL = "USE TEMP B-TREE FOR ORDER BY"  # not "... FOR RIGHT PART OF ORDER BY"


def micros(value: datetime) -> int:
    """An aware date as the embedded index stores it: epoch microseconds."""
    return (value - _EPOCH) // timedelta(microseconds=1)


class IndexedBy(TableClause):
    """A table that a FROM clause names with ``INDEXED BY <index>``: SQLite then uses
    that index (or fails the statement if it cannot)."""

    inherit_cache = False

    def __init__(self, name: str, index: str, *columns: sa.ColumnClause[Any]) -> None:
        super().__init__(name, *columns)
        self.index = index


@compiles(IndexedBy)
def _indexed_by(element: IndexedBy, compiler: SQLCompiler, **kw: Any) -> str:
    name = compiler.preparer.quote(element.name)
    if not kw.get("asfrom"):
        return name
    return f"{name} INDEXED BY {compiler.preparer.quote(element.index)}"


class EmbeddedColumns:
    """The ``Resolver`` of one concrete embedded index (read through ``indexed_by``, one
    of its secondary indexes, if given)."""

    dialect = "sqlite"

    def __init__(self, schema: Schema, index: str, indexed_by: str | None = None) -> None:
        self.schema = schema
        columns: list[sa.ColumnClause[Any]] = [
            sa.column("rid", sa.Integer()),
            sa.column("id", sa.String()),
            sa.column("version", sa.BigInteger()),
            *(sa.column(f.name, _TYPES[f.kind]) for f in schema.columns),
        ]
        self.table: TableClause = (
            sa.table(index, *columns)
            if indexed_by is None
            else IndexedBy(index, indexed_by, *columns)
        )
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


def _page_sql(
    schema: Schema,
    index: str,
    node: Node,
    order: tuple[SortKey, ...],
    limit: int,
    indexed_by: str | None = None,
) -> tuple[str, list[Any]]:
    """The page's rows (rid, id, version) of a prepared filter and order."""
    columns = EmbeddedColumns(schema, index, indexed_by)
    compiler = SqlCompiler(columns, schema.fields)
    t = columns.table
    statement = (
        sa.select(t.c.rid, t.c.id, t.c.version)
        .where(compiler.where(node))
        .order_by(*compiler.order_by(order))
        .limit(limit)
    )
    return _sql(statement)


def search(
    conn: sqlite3.Connection, schema: Schema, index: str, request: SearchRequest, timeout: float
) -> list[StoredDocument]:
    """One page of ``request`` from ``index``, inside the caller's read transaction.

    Two statements: the page's rows (filtered, ordered, limited) from the narrow table,
    then the documents of those rows only. Joining the documents into the first would
    make SQLite read (and, when the plan sorts, carry through the sort) the ~1.5 KB JSON
    of every row that passes the filter, not only of the page's. Both run in the
    caller's transaction, so they see the same snapshot.
    """
    node, order = prepare(request, schema.fields)
    sql, params = _page_sql(schema, index, node, order, request.limit)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("embedded search on %s: %s %r", index, sql, params)
    docs_sql = (
        f"SELECT rid, doc FROM {doc_table(index)} WHERE rid IN (SELECT value FROM json_each(?))"
    )

    def page(deadline: Deadline) -> list[tuple[str, int, str]]:
        rows: list[Any] | None = None
        walk = _walk_index(conn, schema, index, sql, params, order, request.limit)
        if walk is not None:
            walk_sql, walk_params = _page_sql(schema, index, node, order, request.limit, walk)
            rows = _within(conn, deadline, walk_sql, walk_params, WALK_BUDGET_S)
            log.debug("embedded search on %s: walk of %s %s", index, walk, rows is not None)
        if rows is None:
            rows = conn.execute(sql, params).fetchall()
        if not rows:
            return []
        found = dict(conn.execute(docs_sql, (json.dumps([rid for rid, _, _ in rows]),)))
        return [(doc_id, version, found[rid]) for rid, doc_id, version in rows]

    return [StoredDocument(i, v, decode_json(doc)) for i, v, doc in _run(conn, page, timeout)]


def _walk_index(
    conn: sqlite3.Connection,
    schema: Schema,
    index: str,
    sql: str,
    params: list[Any],
    order: tuple[SortKey, ...],
    limit: int,
) -> str | None:
    """The index to walk in the sort order before running the planner's plan, if any.

    Only when the plan sorts all the rows it reads (``USE TEMP B-TREE FOR ORDER BY``),
    an index leads with the first sort key, and the ANALYZE statistics say the plan
    reads more than ``WALK_ROWS_PER_RESULT`` rows per requested row: a filter whose index
    yields fewer is answered well by the planner, and a walk would find few matches.
    The statistics are averages per value: ``state = ?`` is 1/8 of the rows whether it
    is ``active`` (3/4) or ``rescued`` (none), hence a walk with a time budget rather
    than a decision.
    """
    if not order:
        return None
    walk = order_index(schema.resource, index, order[0].field)
    if walk is None:
        return None
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    if _SORTS_ALL not in plan:
        return None  # already walks an index in order (or sorts only ties)
    try:
        stats = dict(conn.execute("SELECT idx, stat FROM sqlite_stat1 WHERE tbl = ?", (index,)))
    except sqlite3.OperationalError:
        return None  # never analyzed: no estimate
    if walk not in stats:
        return None  # no statistics for it (or no such index in an older layout)
    rows = _rows_read(plan, index, stats)
    return walk if rows is not None and rows > WALK_ROWS_PER_RESULT * limit else None


_PLAN_LINE = re.compile(r"(SCAN|SEARCH) (\S+)(?: USING (?:COVERING )?INDEX (\S+)(?: \((.*)\))?)?")
_EQUAL = re.compile(r"\S+=\?")


def _rows_read(plan: list[str], table: str, stats: Mapping[str, str]) -> float | None:
    """The rows a plan reads from ``table``, estimated as SQLite does from
    ``sqlite_stat1``: an index's average rows per value of its first k columns for k
    equality terms, a quarter for each range term. ``None`` when it cannot tell."""
    total = 0.0
    for detail in plan:
        line = _PLAN_LINE.fullmatch(detail)
        if line is None or line[2] != table:
            continue
        kind, _, used, terms = line.groups()
        if used is None:
            if kind == "SEARCH":
                continue  # by rowid: a few rows
            used = next(iter(stats))  # a full scan: every row, which any index counts
            terms = ""
        numbers = stats.get(used, "").split()
        if not numbers or not numbers[0].isdigit():
            return None
        clauses = [t for t in (terms or "").split(" AND ") if t]
        equal = sum(1 for t in clauses if _EQUAL.fullmatch(t))
        if equal >= len(numbers) or not numbers[equal].isdigit():
            return None
        total += int(numbers[equal]) / 4 ** (len(clauses) - equal)
    return total


def _within(
    conn: sqlite3.Connection, deadline: Deadline, sql: str, params: list[Any], budget: float
) -> list[Any] | None:
    """The rows of ``sql``, or ``None`` if it runs longer than ``budget`` seconds (an
    interrupted read leaves the transaction and its snapshot as they were)."""
    until = min(deadline.at, time.monotonic() + budget)
    conn.set_progress_handler(lambda: time.monotonic() > until, _WALK_STEPS)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if signalled(exc, until):  # aborted before its budget ran out
            raise KeyboardInterrupt from exc
        cut = getattr(exc, "sqlite_errorname", "") == "SQLITE_INTERRUPT"
        if cut and not deadline.expired and time.monotonic() <= deadline.at:
            return None
        raise
    finally:
        conn.set_progress_handler(lambda: time.monotonic() > deadline.at, _PROGRESS_STEPS)


def _run(conn: sqlite3.Connection, statements: Callable[[Deadline], _T], timeout: float) -> _T:
    """``statements`` run on ``conn`` under one deadline (``EngineTimeout`` past it)."""
    deadline = Deadline()
    deadline.arm(timeout)
    install(conn, deadline)
    conn.set_progress_handler(lambda: time.monotonic() > deadline.at, _PROGRESS_STEPS)
    try:
        return statements(deadline)
    except sqlite3.OperationalError as exc:
        if deadline.expired or time.monotonic() > deadline.at:
            raise EngineTimeout(f"embedded search ran past {timeout:g} s") from exc
        if signalled(exc, deadline.at):
            raise KeyboardInterrupt from exc
        raise
    finally:
        conn.set_progress_handler(None, 0)
