"""Query v2 (Ganeti's query2 design) over instances and nodes.

* ``GET /v2.1/query/{resource}/fields[?fields=a,b]``: field definitions; names not in
  the registry come back as kind ``unknown``, as Ganeti answers.
* ``POST /v2.1/query/{resource}`` with ``{"fields": [...], "filter": [...] | null}``:
  ``{"fields": [definitions], "data": [[[status, value], ...], ...]}``, rows in uuid
  order (statuses in ``cellsight.api.query2.rows``, filters in
  ``cellsight.api.query2.sexpr``). The filter may also be a string in Ganeti's
  human-readable syntax (``cellsight.api.query2.text``).
* ``GET /v2.1/query/{resource}?fields=a,b&filter=TEXT``: the same answer, the filter
  (optional) in the human-readable syntax.

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

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from cellsight.api import headers
from cellsight.api.auth import Principal, current_principal
from cellsight.api.encoding import FastJSONResponse
from cellsight.api.errors import BadRequest, Forbidden, NotFound
from cellsight.api.fanout import SkippedCell
from cellsight.api.json_bodies import json_body
from cellsight.api.param_values import parse_bool
from cellsight.api.query2 import nodes
from cellsight.api.query2.evaluate import Deadline, EvaluationDeadline
from cellsight.api.query2.fields import REGISTRY, RESOURCES, definitions
from cellsight.api.query2.instances import MAPPING_FIELDS, query_instances
from cellsight.api.query2.rows import INSTANCE_LIVE, NODE_LIVE, Item, render
from cellsight.api.query2.sexpr import FilterError, ParsedFilter, parse
from cellsight.api.query2.text import parse_text
from cellsight.query.prepare import encodable
from cellsight.query.tree import Node

log = logging.getLogger(__name__)
router = APIRouter(tags=["query"])

# Bounds on a query before it is parsed: a field named 10,000 times, or a filter of a
# million nodes, is a 400 naming the part, not seconds of work.
MAX_FIELDS = 200
MAX_FIELD_NAME = 64
MAX_FILTER_NODES = 2000
MAX_FILTER_STRING = 4096
# Values in an answer (its items times its fields): 10,000 instances of 25 fields. A
# probe asked for the heaviest fields 200 times over 8,462 instances: a 75 MB body, and
# a dozen of those at once left the API at 2 GB.
MAX_VALUES = 250_000
ADMIN_ONLY_VALUES = frozenset(
    {"host", "node", "reservation_id", "kernel_id", "ramdisk_id", "cell_uuid"}
)
ADMIN_ONLY_FILTERS = ADMIN_ONLY_VALUES | {"tenant_id", "deleted"}


@dataclass(frozen=True)
class QueryBody:
    fields: list[str]
    filter: Any
    bypass_cache: bool = False  # node queries: snapshot the cells, refill the cache


def _resource(resource: str) -> str:
    if resource not in RESOURCES:
        raise NotFound(f"Unknown query resource {resource[:40]!r} (use {' or '.join(RESOURCES)})")
    return resource


def _body(raw: bytes) -> QueryBody:
    usage = 'The body must be a JSON object {"fields": [names], "filter": [...] or null}'
    body = json_body(raw)
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
    check_fields(fields)
    check_filter_size(body.get("filter"))
    return QueryBody(fields, body.get("filter"))


def check_fields(fields: list[str]) -> None:
    if len(fields) > MAX_FIELDS:
        raise BadRequest(
            f"'fields' names at most {MAX_FIELDS} fields (got {len(fields)})", parameter="fields"
        )
    for name in fields:
        if not encodable(name):
            raise BadRequest(
                "'fields': a field name must be valid Unicode (no lone surrogates)",
                parameter="fields",
            )
        if len(name) > MAX_FIELD_NAME:
            raise BadRequest(
                f"'fields': a field name is at most {MAX_FIELD_NAME} characters "
                f"({name[:40]!r}... has {len(name)})",
                parameter="fields",
            )


def check_filter_size(tree: Any) -> None:
    """At most ``MAX_FILTER_NODES`` lists and values (strings of at most
    ``MAX_FILTER_STRING`` characters), counted without recursion."""
    seen, stack = 0, [tree]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_FILTER_NODES:
            raise BadRequest(
                f"The filter has more than {MAX_FILTER_NODES} operators and values",
                parameter="filter",
            )
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and len(node) > MAX_FILTER_STRING:
            raise BadRequest(
                f"The filter has a value of {len(node)} characters (at most {MAX_FILTER_STRING})",
                parameter="filter",
            )


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
        if isinstance(body.filter, str):
            parsed = parse_text(resource, body.filter)
        else:
            parsed = parse(resource, body.filter)
    except FilterError as exc:
        raise BadRequest(str(exc), parameter="filter") from None
    _forbid(principal, resource, body.fields, parsed.fields)
    try:
        if resource == "node":
            items, path, skipped = _nodes(state, parsed.tree, body.bypass_cache)
        else:
            items, path, skipped = _instances(state, principal, body.fields, parsed)
    except EvaluationDeadline as exc:
        raise BadRequest(f"The filter is too costly: {exc}", parameter="filter") from None
    if len(items) * len(body.fields) > MAX_VALUES:
        raise BadRequest(
            f"The answer would hold {len(items)} items of {len(body.fields)} fields, more "
            f"than {MAX_VALUES:,} values; ask for fewer fields or narrow the filter",
            parameter="fields",
        )
    out = {headers.PATH: path}
    if skipped:
        out[headers.SKIPPED_CELLS] = headers.skipped_cells(skipped, admin=principal.is_admin)
    data = render(resource, body.fields, items)
    return FastJSONResponse(
        {"fields": definitions(resource, body.fields), "data": data}, headers=out
    )


def _nodes(state: State, tree: Node, bypass: bool) -> tuple[list[Item], str, list[SkippedCell]]:
    snapshot = nodes.node_cache(state).get(bypass=bypass)
    deadline = Deadline(state.settings.search_timeout)  # from here: the cache is not the filter's
    items = [
        # A node of a cell that did not answer: its last known identity, no live data.
        Item(doc, known=doc.keys() - NODE_LIVE)
        if snapshot.stale(doc)
        else Item(doc, offline=NODE_LIVE if doc.get("offline") else frozenset())
        for doc in nodes.select(snapshot, tree, deadline)
    ]
    path = "index" if snapshot.source == "index" else "fanout"
    return items, path, list(snapshot.skipped_cells)


def _instances(
    state: State, principal: Principal, fields: list[str], parsed: ParsedFilter
) -> tuple[list[Item], str, list[SkippedCell]]:
    answer = query_instances(state, principal, parsed.tree, parsed.fields)
    wanted = {REGISTRY["instance"][f].doc_field for f in fields if f in REGISTRY["instance"]}
    snapshot = None
    # Whether a host is down is for administrators (Nova's ``host_status`` policies):
    # a member sees its servers' power state as last reported, never "offline".
    if principal.is_admin and wanted & INSTANCE_LIVE and answer.documents:
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
    names = _field_names(request.query_params.getlist("fields"))
    return JSONResponse({"fields": definitions(resource, names)})


def _bypass(request: Request) -> bool:
    values = request.query_params.getlist("bypass_cache")
    if len(values) > 1:
        raise BadRequest("'bypass_cache' given more than once", parameter="bypass_cache")
    return bool(values) and parse_bool("bypass_cache", values[0])


def _field_names(raw: list[str]) -> list[str] | None:
    """``fields=a,b&fields=c`` → names, bounded (``check_fields``); None when absent."""
    if not raw:
        return None
    names = [n.strip() for part in raw for n in part.split(",") if n.strip()]
    check_fields(names)
    return names


@router.get("/v2.1/query/{resource}", summary="Query v2 with a human-readable filter")
async def query_get(
    resource: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    _resource(resource)
    params = request.query_params
    extra = sorted({k for k in params if k not in ("fields", "filter", "bypass_cache")})
    if extra:
        raise BadRequest(
            f"Unknown query parameter(s): {', '.join(k[:40] for k in extra)}", parameter=extra[0]
        )
    names = _field_names(params.getlist("fields"))
    if not names:
        raise BadRequest("'fields' is required: a comma-separated list", parameter="fields")
    filters = params.getlist("filter")
    if len(filters) > 1:
        raise BadRequest("'filter' given more than once", parameter="filter")
    body = QueryBody(names, filters[0] if filters else None, _bypass(request))
    return await run_in_threadpool(_answer, request.app.state, principal, resource, body)


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
                    "fields": {
                        "type": "array",
                        "maxItems": MAX_FIELDS,
                        "items": {"type": "string", "maxLength": MAX_FIELD_NAME},
                    },
                    "filter": {
                        "type": ["array", "string", "null"],
                        "description": 'An S-expression such as ["&", ["==", "state", '
                        '"active"], ["=~", "name", "^web"]], or the same as text: '
                        "'state == \"active\" and name =~ m/^web/'",
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
    extra = sorted({k for k in request.query_params if k != "bypass_cache"})
    if extra:
        raise BadRequest(
            f"Unknown query parameter(s): {', '.join(k[:40] for k in extra)}", parameter=extra[0]
        )
    body = _body(await request.body())
    body = QueryBody(body.fields, body.filter, _bypass(request))
    # The paths block on databases: keep them off the event loop.
    return await run_in_threadpool(_answer, request.app.state, principal, resource, body)
