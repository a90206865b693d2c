"""A cell's rows as index writes: keyset-paged streams, flat memory.

Every stream pages by ``uuid`` (unique, indexed, code-point order on every dialect: the
order the index's ``iter_versions`` uses too) and ends its read transaction after each
page, so a long sync neither pins an old snapshot (MariaDB's repeatable read, SQLite's
WAL checkpoints) nor holds more than one page per stream in memory.

Scope: instance rows of every state (deletes are indexed as tombstones) except those
deleted before the purge floor (``index purge`` removed their tombstones, and the writer
refuses to recreate them); node rows not deleted (node documents have no tombstones).
Sync, verify and the counts they compare all use the same scope.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import connection_dropped, first_line
from cellsight.cells.errors import ROW_FAULTS, UnreadableRow, row_fault, safe_url
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import get_instance
from cellsight.cells.schema import compute_nodes, instances
from cellsight.indexer.engines.base import SearchEngine, WriteOp
from cellsight.indexer.purge import current_floor
from cellsight.indexer.row_documents import (
    FastInstanceDocs,
    NeedsReference,
    node_row_document,
    now_stamp,
    reference_document,
)
from cellsight.notifications.errors import brief

log = logging.getLogger(__name__)

_RAW_INSTANCE_COLUMNS = [sa.type_coerce(c, sa.types.NullType()).label(c.name) for c in instances.c]
_FAST = FastInstanceDocs([c.name for c in instances.c])
# Bound parameters per IN list: far below every dialect's limit.
IN_CHUNK = 500


@dataclass(frozen=True)
class CellRef:
    """What a reader needs to know of a cell; plain values, so it can go to a process."""

    uuid: str
    name: str
    url: str


@dataclass(frozen=True)
class Scope:
    resource: str
    purge_floor: datetime | None = None

    @property
    def table(self) -> sa.Table:
        return instances if self.resource == "instance" else compute_nodes

    def where(self) -> list[sa.ColumnElement[bool]]:
        if self.resource == "node":
            return [compute_nodes.c.deleted.is_(False)]
        purged = self.purged()
        return [] if purged is None else [sa.not_(purged)]

    def purged(self) -> sa.ColumnElement[bool] | None:
        """The instance rows deleted before the purge floor: out of the index's scope, as
        their purged tombstones are, though the cells keep them until Nova archives them."""
        if self.resource != "instance" or self.purge_floor is None:
            return None
        c = instances.c
        return sa.and_(c.deleted.is_(True), c.deleted_at < self.purge_floor)


def scope_of(engine: SearchEngine, resource: str, registry: CellRegistry) -> Scope:
    return Scope(resource, current_floor(engine, registry) if resource == "instance" else None)


def count_rows(conn: sa.Connection, scope: Scope) -> int:
    query = sa.select(sa.func.count()).select_from(scope.table).where(*scope.where())
    try:
        return int(conn.execute(query).scalar_one())
    finally:
        conn.rollback()


def _pages(
    conn: sa.Connection,
    query: sa.Select[Any],
    uuid: sa.ColumnElement[Any],
    size: int,
    *,
    raw: bool = False,
) -> Iterator[Sequence[Any]]:
    """Pages of rows in uuid order; ``raw``: the driver's tuples (no ``Row`` objects,
    which cost the fast path a third of its time), for queries without result types."""
    at = list(query.selected_columns.keys()).index("uuid")
    after: str | None = None
    while True:
        page = query.order_by(uuid).limit(size)
        if after is not None:
            page = page.where(uuid > after)
        rows = _read_page(conn, page, uuid, raw)
        if rows:
            yield rows
        if len(rows) < size:
            return
        after = rows[-1][at]


def _read_page(
    conn: sa.Connection, page: sa.Select[Any], uuid: sa.ColumnElement[Any], raw: bool
) -> Sequence[Any]:
    """One page in a short read transaction of its own; read again, once, on a new
    connection when the server dropped this one: keyset paging resumes where it was, and
    a failover or a killed session would otherwise fail a whole sync or verify."""
    try:
        return _read_naming(conn, page, uuid, raw)
    except sa.exc.DBAPIError as exc:
        if not connection_dropped(exc):
            raise
        conn.rollback()
        log.warning(
            "database %s dropped the connection (%s): reading the page again",
            safe_url(conn.engine.url),
            first_line(exc.orig),
        )
        return _read_naming(conn, page, uuid, raw)
    finally:
        conn.rollback()  # one short read transaction per page


def _read(conn: sa.Connection, query: sa.Select[Any], raw: bool) -> Sequence[Any]:
    result = conn.execute(query)
    rows: Sequence[Any] = result.cursor.fetchall() if raw else result.all()
    result.close()
    return rows


def _read_naming(
    conn: sa.Connection, query: sa.Select[Any], uuid: sa.ColumnElement[Any], raw: bool
) -> Sequence[Any]:
    """``_read``; a page that fails on a value it cannot convert raises the row and
    column that hold it (``_culprit``), where it can find them."""
    try:
        return _read(conn, query, raw)
    except fetch_faults(conn) as exc:
        conn.rollback()
        if value_fault(exc) and (culprit := _culprit(conn, query, uuid, raw)) is not None:
            raise culprit from exc
        raise


def fetch_faults(conn: sa.Connection) -> tuple[type[Exception], ...]:
    """What fetching a page raises for a value the driver or a column type cannot convert
    (PostgreSQL's 'infinity' timestamp, a JSON integer past 4,300 digits): the model's
    faults, and the driver's own ``DataError`` (a raw fetch is not wrapped by SQLAlchemy).
    SQLite's driver raises ``OperationalError`` for text that is not UTF-8 (SQLite stores
    any bytes as text), its only error for a value it cannot convert (``value_fault``
    tells it from a lock or an I/O error of that type)."""
    dbapi = conn.dialect.loaded_dbapi
    if conn.dialect.name == "sqlite":
        return (*ROW_FAULTS, sa.exc.DataError, sa.exc.OperationalError, dbapi.OperationalError)
    return (*ROW_FAULTS, sa.exc.DataError, dbapi.DataError)


def value_fault(exc: BaseException) -> bool:
    """Whether a fault of ``fetch_faults`` can be a value's: SQLite's decode failure is
    the one ``OperationalError`` without an SQLite error code (a lock, a busy database,
    an I/O error or a missing column have theirs)."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    if isinstance(orig, sqlite3.OperationalError):
        return getattr(orig, "sqlite_errorcode", None) is None
    return True


def _culprit(
    conn: sa.Connection, page: sa.Select[Any], uuid: sa.ColumnElement[Any], raw: bool
) -> UnreadableRow | None:
    """The row and column of a page that could not be read (a value the driver or a
    column type cannot convert fails the whole page, named by neither): the page's uuids,
    then each row whole until one fails, then that row one column at a time. Only after
    a failure; about as many statements as the page has rows and the table columns."""
    faults = fetch_faults(conn)

    def fails(query: sa.Select[Any]) -> BaseException | None:
        try:
            _read(conn, query, raw)
        except faults as exc:
            if not value_fault(exc):
                raise
            return exc
        finally:
            conn.rollback()
        return None

    try:
        uuids = [u for (u,) in _read(conn, page.with_only_columns(uuid), raw=False)]
    except faults:
        return None  # then the page's own error, as it was
    finally:
        conn.rollback()
    for found in uuids:
        if fails(page.where(uuid == found)) is None:
            continue
        for column in page.selected_columns:
            failure = fails(page.with_only_columns(column).where(uuid == found))
            if failure is not None:
                return UnreadableRow(found, f"column {column.key}: {row_fault(failure)}")
        return None
    return None


def iter_versions(conn: sa.Connection, scope: Scope, batch_size: int) -> Iterator[tuple[str, int]]:
    """``(uuid, revision)`` of the rows in scope, in uuid order."""
    t = scope.table
    query = sa.select(t.c.uuid, t.c.revision).where(*scope.where())
    for rows in _pages(conn, query, t.c.uuid, batch_size):
        for uuid, revision in rows:
            if type(uuid) is not str:
                # A BLOB (SQLite sorts it after every text): out of the uuid order the
                # compare walks in, and ``str()`` would name it "b'…'", so its live
                # document read as an orphan and a repair tombstoned it (an adversarial
                # probe). The cell is not compared; it is named.
                why = f"uuid stored as {type(uuid).__name__}, not text"
                raise UnreadableRow(brief(uuid, 60), why)
            try:
                version = int(revision)
            except ROW_FAULTS:
                why = f"revision {brief(revision, 60)} is not an integer"
                raise UnreadableRow(uuid, why) from None
            yield uuid, version


class CellDocs:
    """A cell's rows → ``WriteOp``s carrying the row's revision as external version."""

    def __init__(self, scope: Scope, cell_uuid: str, event_type: str) -> None:
        self.scope = scope
        self.cell_uuid = cell_uuid
        self.event_type = event_type
        self.fallbacks = 0  # rows that took the reference path (tests expect none)

    def _query(self) -> sa.Select[Any]:
        if self.scope.resource == "instance":
            return sa.select(*_RAW_INSTANCE_COLUMNS)  # type: ignore[return-value]
        return sa.select(compute_nodes)

    def iter_batches(self, conn: sa.Connection, batch_size: int) -> Iterator[list[WriteOp]]:
        """Every row in scope, ``batch_size`` rows per page, as write ops."""
        t = self.scope.table
        query = self._query().where(*self.scope.where())
        raw = self.scope.resource == "instance"
        for rows in _pages(conn, query, t.c.uuid, batch_size, raw=raw):
            yield self.ops(conn, rows)

    def fetch(self, conn: sa.Connection, uuids: Sequence[str]) -> list[WriteOp]:
        """The ops of these rows as they are now (absent ones left out), in uuid order."""
        t = self.scope.table
        out: list[WriteOp] = []
        for start in range(0, len(uuids), IN_CHUNK):
            chunk = list(uuids[start : start + IN_CHUNK])
            query = self._query().where(t.c.uuid.in_(chunk), *self.scope.where())
            try:
                rows = _read_naming(conn, query.order_by(t.c.uuid), t.c.uuid, raw=False)
            finally:
                conn.rollback()
            out.extend(self.ops(conn, rows))
        return out

    def existing(
        self, conn: sa.Connection, uuids: Sequence[str], *, purged: bool = False
    ) -> set[str]:
        """Which of ``uuids`` have a row in scope now (``purged``: a row out of scope,
        deleted before the purge floor)."""
        t = self.scope.table
        found: set[str] = set()
        if purged:
            below = self.scope.purged()
            if below is None:
                return found
            where = [below]
        else:
            where = self.scope.where()
        for start in range(0, len(uuids), IN_CHUNK):
            chunk = list(uuids[start : start + IN_CHUNK])
            query = sa.select(t.c.uuid).where(t.c.uuid.in_(chunk), *where)
            try:
                found.update(str(u) for (u,) in conn.execute(query))
            finally:
                conn.rollback()
        return found

    def ops(self, conn: sa.Connection, rows: Sequence[sa.Row[Any]]) -> list[WriteOp]:
        if self.scope.resource == "node":
            docs = [node_row_document(dict(r._mapping), self.cell_uuid) for r in rows]
            return [WriteOp("node", d["uuid"], d["version"], d) for d in docs]
        stamp = now_stamp()
        out = []
        for raw in rows:
            doc: dict[str, Any] | None
            try:
                doc = _FAST.document(raw, self.cell_uuid, self.event_type, stamp)
            except NeedsReference:
                doc = self._reference(conn, raw[_FAST.uuid_at])
            if doc is None:
                continue  # the row went away since the page was read
            out.append(WriteOp("instance", doc["uuid"], doc["version"], doc))
        return out

    def _reference(self, conn: sa.Connection, uuid: str) -> dict[str, Any] | None:
        self.fallbacks += 1
        try:
            row = get_instance(conn, uuid)
            if row is None:
                return None
            return reference_document(row, self.cell_uuid, self.event_type)
        except ROW_FAULTS as exc:
            # A row written by other means: the sync fails naming it, not only its error.
            raise UnreadableRow.of(uuid, exc) from exc
        finally:
            conn.rollback()
