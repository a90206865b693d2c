"""Request bodies read as JSON, one way for every route that takes one (the query v2
API, reservations): a bound on their size, and what is wrong named in the API's words,
never the parser's text or a 500."""

from __future__ import annotations

import json
import sys
from typing import Any

from cellsight.api.errors import BadRequest

MAX_BODY = 1024 * 1024


def json_body(raw: bytes) -> Any:
    """``raw`` parsed, or ``BadRequest`` saying why not."""
    if len(raw) > MAX_BODY:
        raise BadRequest(f"The request body is over {MAX_BODY} bytes", parameter="body")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(
            f"The request body is not valid JSON: {_fault(exc)}", parameter="body"
        ) from None


def _fault(exc: ValueError | RecursionError) -> str:
    """What is wrong with the body, by the error's type: the parser's own text for an
    integer too long to convert named CPython's setting, cut mid-word."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"  # deeper than the JSON parser goes; never a 500
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8"
    # The one other ValueError the parser raises: an integer's digits past the bound.
    return f"a number has more than {sys.get_int_max_str_digits()} digits"
