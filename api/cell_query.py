"""The fan-out path's per-cell query and its results as index documents.

Each cell answers ``select_instances`` (filter with keyset, total order, limit); the
API merge-sorts the cells' answers in the same total order. A result row becomes the
document the index holds for it, ``instance_document(row_to_payload(row))`` at version
``revision``, so the two paths return the same documents (``documents.comparable``:
``event_type`` and ``indexed_at`` say how a document was written, not what it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from cellsight.api.cell_columns import CellColumns
from cellsight.cells.errors import ROW_FAULTS, UnreadableRow
from cellsight.cells.reads import fetch_rows
from cellsight.cells.rows import row_to_payload
from cellsight.cells.schema import instances
from cellsight.indexer.documents import instance_document
from cellsight.indexer.engines.base import StoredDocument
from cellsight.indexer.fields import field_map
from cellsight.notifications.payloads import InstanceUpdatePayload
from cellsight.query.prepare import prepare
from cellsight.query.sql import SqlCompiler
from cellsight.query.tree import SearchRequest

# What a document built from a cell row says it came from.
FANOUT_EVENT_TYPE = "instance.update"


def select_instances(
    request: SearchRequest, dialect: str, *, cell_uuid: str | None = None
) -> sa.Select[Any]:
    """One cell's page: every ``instances`` column, filtered, ordered and limited.

    ``dialect`` is the cell engine's ``dialect.name``; ``cell_uuid`` is the cell's, what
    its documents carry (filters and sorts on ``cell_uuid`` are decided with it).
    """
    fields = field_map("instance")
    node, order = prepare(request, fields)
    compiler = SqlCompiler(CellColumns(dialect, cell_uuid), fields)
    return (
        sa.select(instances)
        .where(compiler.where(node))
        .order_by(*compiler.order_by(order))
        .limit(request.limit)
    )


def row_document(row: Mapping[Any, Any], cell_uuid: str | None) -> StoredDocument:
    """A result row as the index's document for it, versioned by its ``revision``."""
    # The update payload, as bulk sync builds it (cellsight.indexer.row_documents): a NULL
    # tags column means no tags ([]), not "unknown".
    row = dict(row)
    try:
        payload = row_to_payload(row, cell_uuid, InstanceUpdatePayload)
        version = int(row["revision"])
        document = instance_document(payload, FANOUT_EVENT_TYPE, version, cell_uuid=cell_uuid)
    except ROW_FAULTS as exc:
        # The cell is skipped and named, as for a cell that fails: not a 500.
        raise UnreadableRow.of(row.get("uuid", "?"), exc) from exc
    return StoredDocument(str(row["uuid"]), version, document)


def search_cell(
    conn: sa.Connection, request: SearchRequest, *, cell_uuid: str | None = None
) -> list[StoredDocument]:
    """``select_instances`` run on one cell connection, as documents."""
    query = select_instances(request, conn.dialect.name, cell_uuid=cell_uuid)
    return [row_document(row, cell_uuid) for row in fetch_rows(conn, query)]
