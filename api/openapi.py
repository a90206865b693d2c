"""The OpenAPI document, completed where FastAPI cannot see: the servers resources parse
their query strings themselves (``cellsight.api.params``), so their parameters, the microversion
headers, the ``X-Auth-Token`` scheme, Nova's fault bodies and every status an operation
can answer are added here, from the same tables the parser uses.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from cellsight.api import microversion
from cellsight.api import status as st
from cellsight.api.change_times import MAX_DATE_LENGTH
from cellsight.api.errors import FAULT_NAMES
from cellsight.api.options import TAG_FILTERS, UNSUPPORTED
from cellsight.api.param_values import MAX_REGEX_LENGTH, REGEX_FILTERS
from cellsight.api.params import ALIASES, EXACT_FILTERS, IGNORED, MAX_ANY_VALUE_LENGTH
from cellsight.api.sort_params import IGNORED_SORT_KEYS, SORT_KEYS

SECURITY = "XAuthToken"
_STRING = {"type": "string", "maxLength": MAX_ANY_VALUE_LENGTH}
_BOOL = {
    "type": "string",
    "enum": [
        "0",
        "1",
        "f",
        "false",
        "n",
        "no",
        "off",
        "on",
        "t",
        "true",
        "y",
        "yes",
        "True",
        "False",
    ],
}
# ISO 8601 as Nova's ``parse_isotime`` reads it (``cellsight.api.change_times``): partial
# dates too (``2025``, ``2025-06``), no zone meaning UTC; not JSON Schema's RFC 3339.
_DATE = {"type": "string", "pattern": "^[0-9]{4}", "maxLength": MAX_DATE_LENGTH}
_DATE_DOC = " ISO 8601 as Nova reads it (2025-06-01T12:00:00Z, 2025-06, 2025; UTC by default)."


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items, "maxItems": 20}


def _query(name: str, schema: dict[str, Any], doc: str) -> dict[str, Any]:
    param: dict[str, Any] = {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": doc,
    }
    if schema.get("type") == "array":
        param["style"] = "form"
        param["explode"] = True  # repeated: ?status=ACTIVE&status=ERROR
    return param


def list_parameters() -> list[dict[str, Any]]:
    statuses = sorted(st.STATUSES) + [s.lower() for s in sorted(st.STATUSES)]
    out = [
        _query(
            "limit",
            {"type": "string", "pattern": "^[0-9]{1,7}$"},
            "Page size; capped at the maximum (Nova's behaviour).",
        ),
        _query("marker", {"type": "string", "format": "uuid"}, "Last server of the previous page."),
        _query(
            "sort_key",
            _array({"type": "string", "enum": sorted(SORT_KEYS.keys() | IGNORED_SORT_KEYS)}),
            "Repeatable; host/node are administrator-only (403). Keys Nova ignores (id, "
            "vcpus, …) are dropped with their sort_dir, and refused from 2.75; locked "
            "sorts from 2.73.",
        ),
        _query("sort_dir", _array({"type": "string", "enum": ["asc", "desc"]}), "Repeatable."),
        _query(
            "status",
            _array({"type": "string", "enum": statuses}),
            "Repeatable. DELETED is administrator-only (403).",
        ),
        _query("vm_state", _array(_STRING), "The last value counts. Members: from 2.83."),
        _query("task_state", _array(_STRING), "The last value counts. Members: from 2.83."),
        _query(
            "power_state",
            _array({"type": "string", "maxLength": 16}),
            "A number (0-7) or a name; the last value counts. Members: from 2.83.",
        ),
        _query(
            "changes-since",
            _array(_DATE),
            "Servers changed since (deleted ones included). Repeatable: each value is"
            " checked, the last one counts." + _DATE_DOC,
        ),
        _query(
            "changes-before",
            _array(_DATE),
            "Servers changed before (2.66+). Repeatable as changes-since." + _DATE_DOC,
        ),
        _query("deleted", _BOOL, "Administrators only (dropped for members)."),
        _query(
            "soft_deleted",
            _STRING,
            "Administrators only: with deleted (or its default), any non-empty value"
            " includes soft-deleted servers and an empty one leaves them out (Nova).",
        ),
        _query(
            "all_tenants",
            {"type": "string", "maxLength": 8},
            "All projects; 403 for members when true.",
        ),
        _query("locked", _BOOL, "2.73+."),
        _query("project_id", _STRING, "Administrators, with all_tenants (else ignored)."),
        _query("tenant_id", _STRING, "Alias of project_id; of the two, the later one counts."),
        _query("image", _STRING, "Image id or URL."),
    ]
    for name in REGEX_FILTERS:
        out.append(
            _query(
                name,
                {"type": "string", "maxLength": MAX_REGEX_LENGTH},
                "A regular expression (the portable subset).",
            )
        )
    for name in EXACT_FILTERS:
        out.append(_query(name, {"type": "string", "maxLength": 255}, "Exact match."))
    for alias, name in ALIASES.items():
        out.append(
            _query(alias, {"type": "string", "maxLength": MAX_REGEX_LENGTH}, f"Alias of {name}.")
        )
    for name in TAG_FILTERS:
        out.append(
            _query(
                name,
                {"type": "string", "maxLength": 255, "pattern": "^[^,]+(,[^,]+)*$"},
                "Comma-separated tags (2.26+).",
            )
        )
    for name in sorted(UNSUPPORTED):
        out.append(_query(name, _STRING, "In Nova's schema; no data to filter by: a 400."))
    for name in sorted(IGNORED):
        out.append(_query(name, _STRING, "In Nova's schema; no filter there either: ignored."))
    return out


def header_parameters() -> list[dict[str, Any]]:
    version = "^compute ([1-9][0-9]{0,5}\\.(0|[1-9][0-9]{0,5})|latest)$"
    return [
        {
            "name": microversion.HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "string", "pattern": version, "maxLength": 256},
            "description": f"compute X.Y, {microversion.MIN} to {microversion.MAX}, or latest.",
        },
        {
            "name": microversion.LEGACY_HEADER,
            "in": "header",
            "required": False,
            "schema": {
                "type": "string",
                "pattern": "^([1-9][0-9]{0,5}\\.(0|[1-9][0-9]{0,5})|latest)$",
                "maxLength": 256,
            },
        },
    ]


def fault_schema() -> dict[str, Any]:
    inner = {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
    }
    names = sorted(set(FAULT_NAMES.values()) | {"computeFault"})
    return {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "properties": {n: inner for n in names},
        "additionalProperties": False,
    }


ERRORS = {
    400: "Bad input, naming the parameter",
    401: "No or unknown X-Auth-Token",
    403: "Not allowed to this caller",
    404: "No such resource",
    406: "Microversion not supported",
    414: "Query string too long",
    500: "A bug (the body carries the request id)",
    503: "A database or the pool is unavailable (request id; Retry-After when busy)",
}
_PUBLIC = ("/", "/v2.1", "/healthz", "/readyz", "/metrics")


def _operation_extras(path: str, method: str, op: dict[str, Any]) -> None:
    responses = op.setdefault("responses", {})
    responses.pop("422", None)  # FastAPI's validation status: Cellsight answers 400
    for code, doc in ERRORS.items():
        if path in _PUBLIC and code not in (500, 503):
            continue
        responses.setdefault(
            str(code),
            {
                "description": doc,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Fault"}}},
            },
        )
    if path not in _PUBLIC:
        op["security"] = [{SECURITY: []}]
        params = op.setdefault("parameters", [])
        params.extend(header_parameters())
        if method == "get" and path.endswith(("/servers", "/servers/detail")):
            params.extend(list_parameters())


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        components = doc.setdefault("components", {})
        components.setdefault("securitySchemes", {})[SECURITY] = {
            "type": "apiKey",
            "in": "header",
            "name": "X-Auth-Token",
            "description": "dev mode: user:project (project admin is an administrator); "
            "token mode: a token from the token file.",
        }
        schemas = components.setdefault("schemas", {})
        schemas["Fault"] = fault_schema()
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for path, item in doc.get("paths", {}).items():
            for method, op in item.items():
                _operation_extras(path, method, op)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
