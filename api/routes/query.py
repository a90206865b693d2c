"""Query v2 (Ganeti's query2 design) over instances and nodes.

* ``GET /v2.1/query/{resource}/fields[?fields=a,b]``: field definitions; names not in
  the registry come back as kind ``unknown``, as Ganeti answers.
* ``POST /v2.1/query/{resource}`` with ``{"fields": [...], "filter": [...] | null}``:
  ``{"fields": [definitions], "data": [[[status, value], ...], ...]}``, rows in uuid
  order (statuses in ``api.query2.rows``, filters in ``api.query2.sexpr``).

Scoping, as the servers resource: a non-administrator sees only their project's
instances, and may neither filter on ``host``, ``node``, ``cell_uuid``, ``tenant_id``
or ``deleted`` nor request the administrator-only attributes (Nova's
``OS-EXT-SRV-ATTR:*``: host, node, reservation and kernel/ramdisk ids, plus the cell);
either is a 403 naming the fields. Node queries are administrator-only (Nova's
hypervisor API is, by default policy); their field list is not, it reveals nothing.

The body is parsed here rather than by FastAPI, so that bad JSON, a nesting too deep for
the JSON parser, or an unexpected key is a 400 naming the problem.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from api import headers
from api.auth import Principal, current_principal
from api.errors import BadRequest, Forbidden, NotFound
from api.fanout import SkippedCell
from api.query2 import nodes
from api.query2.fields import REGISTRY, RESOURCES, definitions
from api.query2.instances import MAPPING_FIELDS, query_instances
from api.query2.rows import INSTANCE_LIVE, NODE_LIVE, Item, render
from api.query2.sexpr import FilterError, ParsedFilter, parse
from indexer.query.tree import Node

log = logging.getLogger(__name__)
router = APIRouter(tags=["query"])

MAX_BODY = 1024 * 1024
ADMIN_ONLY_VALUES = frozenset(
    {"host", "node", "reservation_id", "kernel_id", "ramdisk_id", "cell_uuid"}
)
ADMIN_ONLY_FILTERS = ADMIN_ONLY_VALUES | {"tenant_id", "deleted"}


@dataclass(frozen=True)
class QueryBody:
    fields: list[str]
    filter: Any


def _resource(resource: str) -> str:
    if resource not in RESOURCES:
        raise NotFound(f"Unknown query resource {resource[:40]!r} (use {' or '.join(RESOURCES)})")
    return resource


def _body(raw: bytes) -> QueryBody:
    usage = 'The body must be a JSON object {"fields": [names], "filter": [...] or null}'
    if len(raw) > MAX_BODY:
        raise BadRequest(f"The request body is over {MAX_BODY} bytes", parameter="body")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than the JSON parser goes; never a 500.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:100]
        raise BadRequest(
            f"The request body is not valid JSON: {reason}", parameter="body"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest(usage, parameter="body")
    unknown = sorted(set(body) - {"fields", "filter"})
    if unknown:
        raise BadRequest(
            f"Unknown key(s) in the request body: {', '.join(k[:40] for k in unknown)}",
            parameter=unknown[0],
        )
    fields = body.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise BadRequest(f"'fields' must be a list of field names. {usage}", parameter="fields")
    return QueryBody(fields, body.get("filter"))


def _forbid(principal: Principal, resource: str, fields: list[str], named: frozenset[str]) -> None:
    if principal.is_admin:
        return
    if resource == "node":
        raise Forbidden("Node queries are admin-only")
    if requested := sorted(ADMIN_ONLY_VALUES.intersection(fields)):
        raise Forbidden(f"Field(s) {', '.join(requested)} are admin-only")
    if filtered := sorted(ADMIN_ONLY_FILTERS & named):
        raise Forbidden(f"Filtering on {', '.join(filtered)} is admin-only")


def _answer(state: State, principal: Principal, resource: str, body: QueryBody) -> JSONResponse:
    try:
        parsed = parse(resource, body.filter)
    except FilterError as exc:
        raise BadRequest(str(exc), parameter="filter") from None
    _forbid(principal, resource, body.fields, parsed.fields)
    if resource == "node":
        items, path, skipped = _nodes(state, parsed.tree)
    else:
        items, path, skipped = _instances(state, principal, body.fields, parsed)
    out = {headers.PATH: path}
    if skipped:
        out[headers.SKIPPED_CELLS] = headers.skipped_cells(skipped)
    data = render(resource, body.fields, items)
    return JSONResponse({"fields": definitions(resource, body.fields), "data": data}, headers=out)


def _nodes(state: State, tree: Node) -> tuple[list[Item], str, list[SkippedCell]]:
    snapshot = nodes.node_cache(state).get()
    items = [
        Item(doc, offline=NODE_LIVE if doc.get("offline") else frozenset())
        for doc in nodes.select(snapshot, tree)
    ]
    path = "index" if snapshot.source == "index" else "fanout"
    return items, path, list(snapshot.skipped_cells)


def _instances(
    state: State, principal: Principal, fields: list[str], parsed: ParsedFilter
) -> tuple[list[Item], str, list[SkippedCell]]:
    answer = query_instances(state, principal, parsed.tree, parsed.fields)
    wanted = {REGISTRY["instance"][f].doc_field for f in fields if f in REGISTRY["instance"]}
    snapshot = None
    if wanted & INSTANCE_LIVE and answer.documents:
        try:
            snapshot = nodes.node_cache(state).get()
        except Exception:
            # Without node states nothing shows as offline; the query still answers.
            log.warning("node states unavailable; no instance shown as offline", exc_info=True)
    items = [
        Item(
            doc,
            offline=INSTANCE_LIVE
            if snapshot is not None and snapshot.is_offline(doc.get("host"), doc.get("node"))
            else frozenset(),
        )
        for doc in answer.documents
    ]
    items.extend(Item(doc, known=MAPPING_FIELDS) for doc in answer.placeholders)
    items.sort(key=lambda item: str(item.doc["uuid"]))
    return items, answer.path, answer.skipped


@router.get("/v2.1/query/{resource}/fields", summary="Query v2 field definitions")
def query_fields(
    resource: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    _resource(resource)
    extra = sorted({k for k in request.query_params if k != "fields"})
    if extra:
        raise BadRequest(
            f"Unknown query parameter(s): {', '.join(k[:40] for k in extra)}", parameter=extra[0]
        )
    raw = request.query_params.getlist("fields")
    names = None if not raw else [n.strip() for part in raw for n in part.split(",") if n.strip()]
    return JSONResponse({"fields": definitions(resource, names)})


# The body is read by hand (see the module docstring); this documents it all the same.
_BODY_SCHEMA = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["fields"],
                "additionalProperties": False,
                "properties": {
                    "fields": {"type": "array", "items": {"type": "string"}},
                    "filter": {
                        "type": ["array", "null"],
                        "description": 'An S-expression such as ["&", ["==", "state", '
                        '"active"], ["=~", "name", "^web"]]',
                    },
                },
            }
        }
    },
}


@router.post(
    "/v2.1/query/{resource}",
    summary="Query v2: instances or nodes, with a filter",
    openapi_extra={"requestBody": _BODY_SCHEMA},
)
async def query(
    resource: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    _resource(resource)
    body = _body(await request.body())
    # The paths block on databases: keep them off the event loop.
    return await run_in_threadpool(_answer, request.app.state, principal, resource, body)
