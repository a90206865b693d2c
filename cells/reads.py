"""Reading one cell: single rows, keyset-paged streams, counts.

Streams page by ``uuid`` (unique, indexed, compared by code point on every dialect),
one short query per page, so a stream of millions of rows holds no cursor open and
can resume after the last uuid it delivered (``after_uuid``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from cellsight.cells.errors import ROW_FAULTS, UnreadableRow, row_fault
from cellsight.cells.rows import InstanceRow
from cellsight.cells.schema import compute_nodes, instances


def fetch_rows(conn: sa.Connection, query: sa.Select[Any]) -> list[InstanceRow]:
    """The rows of ``query`` as dicts. Values are converted as they are fetched (JSON
    parsed, dates read), so a row written by other means fails the whole fetch before
    its uuid can be read: ``UnreadableRow`` then names the row and the column."""
    try:
        return [dict(row) for row in conn.execute(query).mappings()]
    except ROW_FAULTS as exc:
        raise _which(conn, query, exc) from exc


def _which(conn: sa.Connection, query: sa.Select[Any], exc: Exception) -> UnreadableRow:
    """The failed fetch again with the stored values as the driver gives them, each put
    through its column's own conversion, to find the first that fails."""
    columns = list(query.selected_columns)
    names = [str(c.key) for c in columns]
    raw = query.with_only_columns(
        *(
            sa.type_coerce(c, sa.types.NullType()).label(n)
            for c, n in zip(columns, names, strict=True)
        )
    )
    dialect = conn.dialect
    convert = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
    at_uuid = names.index("uuid") if "uuid" in names else None
    try:
        for row in conn.execute(raw):
            for name, process, value in zip(names, convert, row, strict=True):
                if process is None:
                    continue
                try:
                    process(value)
                except ROW_FAULTS as fault:
                    uuid = "?" if at_uuid is None else row[at_uuid]
                    return UnreadableRow(uuid, f"column {name}: {row_fault(fault)}")
    except sa.exc.SQLAlchemyError:
        pass  # the cell failed meanwhile: the first error is the one to report
    return UnreadableRow("?", row_fault(exc))


def get_instance(conn: sa.Connection, uuid: str, *, for_update: bool = False) -> InstanceRow | None:
    query = sa.select(instances).where(instances.c.uuid == uuid)
    if for_update:
        query = query.with_for_update()
    rows = fetch_rows(conn, query)
    return rows[0] if rows else None


def _where(include_deleted: bool, project_id: str | None) -> list[sa.ColumnElement[bool]]:
    clauses: list[sa.ColumnElement[bool]] = []
    if not include_deleted:
        clauses.append(instances.c.deleted.is_(False))
    if project_id is not None:
        clauses.append(instances.c.project_id == project_id)
    return clauses


def iter_instance_batches(
    conn: sa.Connection,
    batch_size: int = 1000,
    after_uuid: str | None = None,
    *,
    include_deleted: bool = True,
) -> Iterator[list[InstanceRow]]:
    """Every instance row in uuid order, ``batch_size`` rows per list."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    base = sa.select(instances).where(*_where(include_deleted, None))
    while True:
        query = base.order_by(instances.c.uuid).limit(batch_size)
        if after_uuid is not None:
            query = query.where(instances.c.uuid > after_uuid)
        batch = fetch_rows(conn, query)
        if not batch:
            return
        yield batch
        if len(batch) < batch_size:
            return
        after_uuid = batch[-1]["uuid"]


def iter_instances(
    conn: sa.Connection,
    batch_size: int = 1000,
    after_uuid: str | None = None,
    *,
    include_deleted: bool = True,
) -> Iterator[InstanceRow]:
    for batch in iter_instance_batches(
        conn, batch_size, after_uuid, include_deleted=include_deleted
    ):
        yield from batch


def iter_versions(
    conn: sa.Connection, batch_size: int = 10_000, after_uuid: str | None = None
) -> Iterator[tuple[str, int]]:
    """``(uuid, revision)`` of every instance, deleted ones included, in uuid order.

    What an anti-entropy check compares with the index's document versions.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    while True:
        query = (
            sa.select(instances.c.uuid, instances.c.revision)
            .order_by(instances.c.uuid)
            .limit(batch_size)
        )
        if after_uuid is not None:
            query = query.where(instances.c.uuid > after_uuid)
        batch = [(str(uuid), int(revision)) for uuid, revision in conn.execute(query)]
        yield from batch
        if len(batch) < batch_size:
            return
        after_uuid = batch[-1][0]


def count_instances(
    conn: sa.Connection, *, include_deleted: bool = True, project_id: str | None = None
) -> int:
    query = (
        sa.select(sa.func.count())
        .select_from(instances)
        .where(*_where(include_deleted, project_id))
    )
    return int(conn.execute(query).scalar_one())


def list_compute_nodes(conn: sa.Connection, *, include_deleted: bool = False) -> list[InstanceRow]:
    query = sa.select(compute_nodes).order_by(
        compute_nodes.c.host, compute_nodes.c.hypervisor_hostname
    )
    if not include_deleted:
        query = query.where(compute_nodes.c.deleted.is_(False))
    return [dict(row) for row in conn.execute(query).mappings()]


IN_CHUNK = 500  # uuids per IN (...) list


def deleted_flags(conn: sa.Connection, uuids: Sequence[str]) -> dict[str, bool]:
    """Instance uuid → whether its row is deleted, for those of ``uuids`` with a row
    (``cell_removal``: what a removal finds; ``leftovers``: which mappings have none)."""
    found: dict[str, bool] = {}
    for start in range(0, len(uuids), IN_CHUNK):
        chunk = list(uuids[start : start + IN_CHUNK])
        query = sa.select(instances.c.uuid, instances.c.deleted).where(instances.c.uuid.in_(chunk))
        found.update((str(u), bool(d)) for u, d in conn.execute(query))
    return found
