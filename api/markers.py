"""A marker (the last uuid of a page) → the sort values the next page starts after.

Both paths resolve a marker the same way, from the cells: the instance mapping names
the cell, the cell's row gives the values. So a marker issued by one path pages the
other without skipping or repeating rows. An unknown marker and a marker the caller
may not see (another project's instance, for a non-administrator) get the same 400,
with the same message, so a marker reveals nothing.
"""

from __future__ import annotations

from typing import Any

from cellsight.api.auth import Principal
from cellsight.api.cell_documents import row_document
from cellsight.api.driver_errors import API_DB_FAILURES, CELL_FAILURES
from cellsight.api.errors import BadRequest, ServiceUnavailable, unavailable
from cellsight.api.fanout import FanOut
from cellsight.api.headers import named_cell
from cellsight.cells.database import connect
from cellsight.cells.errors import InstanceNotFound, UnknownCell, UnreadableRow
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import get_instance


def marker_not_found(marker: str) -> BadRequest:
    # Nova's wording; the marker is echoed as given (bounded by the parameter parser).
    return BadRequest(f"marker [{marker}] not found", parameter="marker")


def marker_document(
    registry: CellRegistry, fanout: FanOut, marker: str, principal: Principal
) -> dict[str, Any]:
    """The marker instance's document, read from its cell (deleted ones included)."""
    try:
        mapping = registry.find_instance_mapping(marker)
    except InstanceNotFound:
        raise marker_not_found(marker) from None
    except API_DB_FAILURES as exc:
        raise unavailable("The API database is unavailable", exc) from None
    if mapping.cell_uuid is None:
        raise marker_not_found(marker)
    if not principal.is_admin and mapping.project_id != principal.project_id:
        raise marker_not_found(marker)
    try:
        cell = registry.get_cell(mapping.cell_uuid)
    except UnknownCell:
        raise marker_not_found(marker) from None
    except API_DB_FAILURES as exc:
        raise unavailable("The API database is unavailable", exc) from None
    try:
        with connect(fanout.engine(cell)) as conn:
            row = get_instance(conn, mapping.instance_uuid)
    except UnreadableRow as exc:  # a value that fails as it is fetched: retrying won't help
        raise _unreadable(marker, cell.name, principal, exc) from None
    except CELL_FAILURES as exc:
        # Named to administrators: Nova shows no cell to its users.
        raise unavailable(
            f"The cell holding marker [{marker}]"
            f"{named_cell(cell.name, admin=principal.is_admin)} is unavailable; "
            "retry, or list without the marker",
            exc,
        ) from None
    if row is None:
        raise marker_not_found(marker)
    if not principal.is_admin and row.get("project_id") != principal.project_id:
        raise marker_not_found(marker)
    try:
        return row_document(row, cell.uuid)
    except UnreadableRow as exc:
        raise _unreadable(marker, cell.name, principal, exc) from None


def _unreadable(
    marker: str, cell_name: str, principal: Principal, exc: UnreadableRow
) -> ServiceUnavailable:
    """Written by hand past what reads as an instance (an adversarial probe: a 500): the
    page after it cannot be placed, as for a cell that fails."""
    where = f" in cell {cell_name}" if principal.is_admin else ""
    return unavailable(
        f"The row of marker [{marker}]{where} does not read as an instance; list without "
        "the marker",
        exc,
    )
