"""The API's exceptions and the one place they become HTTP answers.

Routes and services raise the narrow ``ApiError`` subclasses; ``install`` registers the
handlers that render them in Nova's fault shape ``{"badRequest": {"code": 400,
"message": ...}}``. Anything else is a bug: it is logged with its traceback and
answered as a 500 in the same shape without internals, so no client ever sees a stack.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

# Nova's ``nova.api.openstack.wsgi.Fault._fault_names``.
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


def fault_body(status: int, message: str) -> dict[str, Any]:
    return {FAULT_NAMES.get(status, "computeFault"): {"code": status, "message": message}}


def fault_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(fault_body(status, message), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    # Only path parameters reach FastAPI's validation (query strings are parsed by
    # ``api.params``); name the first offending one.
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("path", "query"))
        return f"Invalid input for {where or 'the request'}: {error.get('msg', 'invalid')}"
    return "Invalid request"


def install(app: FastAPI) -> None:
    """Register the handlers; call once from the app factory."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return fault_response(exc.status, exc.message, exc.headers)

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
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return fault_response(
            500,
            "Unexpected API Error. Please report this at the Cellsight issue tracker "
            "and attach the API log if possible.",
        )
