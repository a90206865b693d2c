"""The API's exceptions and the one place they become HTTP answers.

Routes and services raise the narrow ``ApiError`` subclasses; ``install`` registers the
handlers that render them in Nova's fault shape ``{"badRequest": {"code": 400,
"message": ...}}``. Anything else is a bug: it is logged with its traceback and
answered as a 500 in the same shape without internals, so no client ever sees a stack.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from cellsight.notifications.errors import clip

log = logging.getLogger(__name__)

# Nova's header; every answer carries it, and 5xx bodies name it instead of internals.
REQUEST_ID_HEADER = "x-openstack-request-id"
REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="req-none")
# Bounds on the request line, checked before routing (a 4xx naming what was too big).
MAX_QUERY_STRING = 16384

# Nova's ``nova.api.openstack.wsgi.Fault._fault_names``; any other code is a
# "computeFault" (a 414 included).
FAULT_NAMES = {
    400: "badRequest",
    401: "unauthorized",
    403: "forbidden",
    404: "itemNotFound",
    405: "badMethod",
    409: "conflictingRequest",
    413: "overLimit",
    415: "badMediaType",
    429: "overLimit",
    501: "notImplemented",
    503: "serviceUnavailable",
}


class ApiError(Exception):
    """An answer other than 2xx, with a message fit for the client."""

    status = 500

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(ApiError):
    status = 400

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


def invalid_parameter(param: str, value: str, why: str) -> BadRequest:
    """Nova's wording for a query parameter's bad value (the value echoed, cut short)."""
    return BadRequest(
        f"Invalid input for query parameters {param}. Value: {clip(value)}. {why}",
        parameter=param,
    )


class Unauthorized(ApiError):
    status = 401

    def __init__(self, message: str = "The request you have made requires authentication.") -> None:
        # Clients (keystoneauth) look for this header to decide how to authenticate.
        super().__init__(message, headers={"WWW-Authenticate": 'Keystone uri="local"'})


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class NotAcceptable(ApiError):
    status = 406


class ServiceUnavailable(ApiError):
    status = 503


def unavailable(what: str, exc: BaseException) -> ServiceUnavailable:
    """A 503 saying ``what`` failed: the driver's text goes to the log under the
    request id, and the client gets the id, never the text."""
    request_id = REQUEST_ID.get()
    log.warning("%s [%s]: %s: %s", what, request_id, type(exc).__name__, exc)
    return ServiceUnavailable(f"{what}. Request ID: {request_id}")


def fault_body(status: int, message: str) -> dict[str, Any]:
    fault = {"code": status, "message": printable(message)}
    return {FAULT_NAMES.get(status, "computeFault"): fault}


def printable(message: str) -> str:
    """``message`` as UTF-8 can carry it: a lone surrogate a client sent (a JSON key
    ``"\\ud800"``, named by the error) is written as its escape, where encoding the
    fault failed and the 400 became a 500."""
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return message.encode("utf-8", "backslashreplace").decode("utf-8")
    return message


def fault_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(fault_body(status, message), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    # Only path parameters reach FastAPI's validation (query strings are parsed by
    # ``cellsight.api.params``); name the first offending one.
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("path", "query"))
        return f"Invalid input for {where or 'the request'}: {error.get('msg', 'invalid')}"
    return "Invalid request"


def undecodable_parameter(query: bytes) -> str | None:
    """The name of the first query parameter whose name or value is not UTF-8 once
    percent-decoded, or None. The framework would decode it with U+FFFD in place of each
    bad byte, and a filter would then silently match nothing. A name that is not UTF-8
    itself is named as it was sent (``%ff``, where every such name was U+FFFD), as a
    path segment is (``raw_paths``)."""
    if b"%" not in query and query.isascii():
        return None
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        raw_name = unquote_to_bytes(name.replace(b"+", b" "))
        try:
            decoded = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            return clip(name.decode("latin-1"))
        try:
            unquote_to_bytes(value.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            return clip(decoded)
    return None


def _with_version(request: Request, headers: dict[str, str] | None) -> dict[str, str] | None:
    """A compute API fault carries the microversion headers, as Nova's ``Fault`` adds
    them whenever the requested version is valid: a cache that varies on them must not
    serve one version's error to another."""
    from cellsight.api import microversion  # it raises this module's errors

    path = request.url.path
    if not path.startswith("/v2.1/") or "/servers" not in path:
        return headers
    try:
        version = microversion.requested(request)
    except ApiError:
        return headers  # the version was what was wrong: Nova names none either
    return {**microversion.response_headers(version), **(headers or {})}


def install(app: FastAPI) -> None:
    """Register the handlers; call once from the app factory."""

    @app.middleware("http")
    async def _request_id(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request_id = f"req-{uuid.uuid4()}"
        REQUEST_ID.set(request_id)
        request.state.request_id = request_id
        query = request.scope.get("query_string", b"")
        if len(query) > MAX_QUERY_STRING:
            response: Response = fault_response(
                414, f"The query string is longer than {MAX_QUERY_STRING} bytes."
            )
        elif (bad := undecodable_parameter(query)) is not None:
            response = fault_response(
                400, f"Invalid input for query parameters {bad}: not valid UTF-8."
            )
        else:
            response = await call_next(request)
        response.headers[REQUEST_ID_HEADER] = request_id
        return response

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return fault_response(exc.status, exc.message, _with_version(request, exc.headers))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return fault_response(400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail) if exc.detail else "Error"
        if exc.status_code == 404:
            message = "The resource could not be found."
        elif exc.status_code == 405:
            message = "The method is not allowed for the requested URL."
        return fault_response(exc.status_code, message, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", REQUEST_ID.get())
        log.error(
            "unexpected error serving %s %s [%s]",
            request.method,
            request.url.path,
            request_id,
            exc_info=exc,
        )
        return fault_response(
            500,
            "Unexpected API Error. Please report this at the Cellsight issue tracker "
            f"and attach the API log if possible. Request ID: {request_id}",
            {REQUEST_ID_HEADER: request_id},
        )
