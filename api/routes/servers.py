"""``GET /v2.1[/{project_id}]/servers``, ``…/servers/detail``, ``…/servers/{id}``.

Handlers are plain functions (FastAPI runs them in its thread pool): the fan-out path
blocks on databases, and the event loop must stay free for other requests.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from fastapi import APIRouter, Depends, Request

from cellsight.api import headers, microversion
from cellsight.api.auth import Principal, current_principal
from cellsight.api.cell_documents import row_document
from cellsight.api.driver_errors import API_DB_FAILURES, CELL_FAILURES, classify
from cellsight.api.encoding import FastJSONResponse
from cellsight.api.errors import BadRequest, NotFound, unavailable
from cellsight.api.fanout import SkippedCell
from cellsight.api.params import parse_list_query
from cellsight.api.paths import InstanceSearch
from cellsight.api.render import LinkContext, Unreachable, detail, summary, unknown
from cellsight.cells.database import connect
from cellsight.cells.errors import InstanceNotFound, UnknownCell, UnreadableRow
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import get_instance
from cellsight.notifications.errors import clip
from cellsight.query.tree import SearchRequest

router = APIRouter(tags=["servers"])

# Nova answers a down cell with minimal records from this microversion on.
DOWN_CELL_VERSION = "2.69"
# ``GET /servers/{id}`` shows ``server_groups`` from this microversion on.
SERVER_GROUPS_VERSION = "2.71"


def _context(request: Request, principal: Principal, project_id: str | None) -> LinkContext:
    version = microversion.requested(request)
    if project_id is not None and project_id != principal.project_id:
        raise BadRequest(
            f"Malformed request URL: URL's project_id '{clip(project_id)}' doesn't match "
            f"Context's project_id '{principal.project_id}'"
        )
    base = str(request.base_url).rstrip("/")
    return LinkContext(base, project_id, version, principal.is_admin)


def list_servers(
    request: Request, principal: Principal, project_id: str | None, *, detailed: bool
) -> FastJSONResponse:
    ctx = _context(request, principal, project_id)
    state = request.app.state
    search: InstanceSearch = state.search
    items = request.query_params.multi_items()
    query = parse_list_query(
        items, principal, max_limit=state.settings.max_limit, version=ctx.version
    )
    after = None
    if query.marker is not None:
        after = search.marker_values(query.marker, query.order, principal)
    page = search.search(
        SearchRequest(query.filter, query.order, query.limit, after),
        principal,
        project=query.project_scope,
    )
    render = detail if detailed else summary
    servers: list[dict[str, Any]] = [render(doc, ctx) for doc in page.documents]
    if page.skipped and ctx.version.at_least(DOWN_CELL_VERSION) and query.down_cell_records:
        # Nova's down-cell records: prefixed, filling what the page has room for. Only
        # when Nova gives them (no filter but all_tenants, no paging or sort parameter):
        # a mapping cannot be filtered or sorted, and records on every page would break
        # paging.
        missing = search.unreachable(page.skipped, query.project_scope, query.limit - len(servers))
        servers = [unknown(entry, ctx, detailed=detailed) for entry in missing] + servers
    body: dict[str, Any] = {"servers": servers}
    if query.limit and len(servers) == query.limit:
        collection = "servers/detail" if detailed else "servers"
        next_href = ctx.next_link(collection, items, servers[-1]["id"])
        body["servers_links"] = [{"rel": "next", "href": next_href}]
    out = microversion.response_headers(ctx.version)
    out[headers.PATH] = page.path
    if page.skipped:
        out[headers.SKIPPED_CELLS] = headers.skipped_cells(page.skipped, admin=principal.is_admin)
    return FastJSONResponse(body, headers=out)


def show_server(
    request: Request, principal: Principal, project_id: str | None, server_id: str
) -> FastJSONResponse:
    """From the instance's cell, never the index (it must be current)."""
    ctx = _context(request, principal, project_id)
    state = request.app.state
    registry: CellRegistry = state.registry
    not_found = NotFound(f"Instance {server_id[:80]} could not be found.")
    if not _uuid_like(server_id):
        # As Nova (is_uuid_like, then InstanceNotFound); and never sent to a database:
        # PostgreSQL refuses a NUL (the registry turns a non-ASCII id away itself).
        raise not_found
    try:
        mapping = registry.find_instance_mapping(server_id)
        if mapping.cell_uuid is None:
            raise not_found
        cell = registry.get_cell(mapping.cell_uuid)
    except (InstanceNotFound, UnknownCell):
        raise not_found from None
    except API_DB_FAILURES as exc:
        raise unavailable("The API database is unavailable", exc) from None
    if not principal.is_admin and mapping.project_id != principal.project_id:
        raise not_found
    out = microversion.response_headers(ctx.version)

    def down(exc: BaseException) -> FastJSONResponse:
        """The cell failed, or its row does not read as an instance (``UnreadableRow``,
        written by hand): as Nova shows an instance of a down cell."""
        if not ctx.version.at_least(DOWN_CELL_VERSION):
            raise unavailable(
                f"The cell holding instance {server_id}"
                f"{headers.named_cell(cell.name, admin=principal.is_admin)} is unavailable",
                exc,
            ) from None
        if mapping.queued_for_delete:
            # Deleted: as Nova (``_get_instance_from_cell``), not found, never UNKNOWN.
            raise not_found from None
        # Nova's show from a down cell dates it by its mapping, as the listing does.
        entry = Unreachable(mapping.instance_uuid, mapping.project_id, mapping.created_at)
        skipped = SkippedCell(cell.uuid, cell.name, classify(exc))
        out[headers.SKIPPED_CELLS] = headers.skipped_cells([skipped], admin=principal.is_admin)
        return FastJSONResponse({"server": unknown(entry, ctx, detailed=True)}, headers=out)

    try:
        with connect(state.fanout.engine(cell)) as conn:
            row = get_instance(conn, mapping.instance_uuid)
    except CELL_FAILURES as exc:  # anything else is our bug: a logged 500
        return down(exc)
    if row is None or row.get("deleted"):
        raise not_found
    if not principal.is_admin and row.get("project_id") != principal.project_id:
        raise not_found
    try:
        document = row_document(row, cell.uuid)
    except UnreadableRow as exc:  # an adversarial probe: a 500
        return down(exc)
    server = detail(document, ctx)
    if ctx.version.at_least(SERVER_GROUPS_VERSION):
        # Nova's show lists the one group holding the instance; groups are not in the
        # notifications Cellsight is built from, so: none (Nova's value for no group).
        server["server_groups"] = []
    return FastJSONResponse({"server": server}, headers=out)


def _uuid_like(value: str) -> bool:
    try:
        uuidlib.UUID(value)
    except ValueError:
        return False
    return True


@router.get("/v2.1/servers", summary="List servers")
def servers_index(request: Request, principal: Principal = Depends(current_principal)) -> Any:
    return list_servers(request, principal, None, detailed=False)


@router.get("/v2.1/servers/detail", summary="List servers with details")
def servers_detail(request: Request, principal: Principal = Depends(current_principal)) -> Any:
    return list_servers(request, principal, None, detailed=True)


@router.get("/v2.1/servers/{server_id}", summary="Show a server")
def servers_show(
    request: Request, server_id: str, principal: Principal = Depends(current_principal)
) -> Any:
    return show_server(request, principal, None, server_id)


@router.get("/v2.1/{project_id}/servers", summary="List servers (project in the URL)")
def project_servers_index(
    request: Request, project_id: str, principal: Principal = Depends(current_principal)
) -> Any:
    return list_servers(request, principal, project_id, detailed=False)


@router.get("/v2.1/{project_id}/servers/detail", summary="List servers with details")
def project_servers_detail(
    request: Request, project_id: str, principal: Principal = Depends(current_principal)
) -> Any:
    return list_servers(request, principal, project_id, detailed=True)


@router.get("/v2.1/{project_id}/servers/{server_id}", summary="Show a server")
def project_servers_show(
    request: Request,
    project_id: str,
    server_id: str,
    principal: Principal = Depends(current_principal),
) -> Any:
    return show_server(request, principal, project_id, server_id)
