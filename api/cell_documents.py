"""Cell rows as instance documents, the form both paths hand to the renderer.

A row becomes the very document the indexer writes for it (``cellsight.api.cell_query``:
the row's snapshot, version = its revision), minus the write bookkeeping
(``comparable``), so the one renderer gives the same body on both paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from cellsight.api import cell_query as cell_query
from cellsight.indexer.documents import comparable
from cellsight.query.tree import SearchRequest


def row_document(row: Mapping[str, Any], cell_uuid: str) -> dict[str, Any]:
    """The document of one ``instances`` row."""
    return comparable(cell_query.row_document(row, cell_uuid).document)


def search_cell(
    conn: sa.Connection, request: SearchRequest, cell_uuid: str
) -> list[dict[str, Any]]:
    """One page of a cell's instances in the request's order, as documents."""
    return [
        comparable(s.document) for s in cell_query.search_cell(conn, request, cell_uuid=cell_uuid)
    ]
