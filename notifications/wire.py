"""Bytes → JSON values, with the contract's limits and named errors.

One parser (orjson) for every body, whatever content type the message declares: a
pickle or YAML body is not JSON and is refused as malformed; nothing is ever unpickled.
What the parser refuses, each a :class:`MalformedNotification` (dead letter
``malformed``): invalid UTF-8 (a UTF-16 body, a byte-order mark), a lone surrogate
escape (``"\\ud800"``), ``NaN``/``Infinity`` (not JSON), nesting deeper than
``limits.PARSER_MAX_DEPTH``, and an empty body. Integers beyond 64 bits are read as floats by
orjson and then refused where an integer field expects a long (``out_of_range``).
Duplicate keys: the last one wins, as in every mainstream JSON parser (RFC 8259 leaves
it open). ``\\u0000`` inside a string is a valid JSON string and is accepted.
"""

from __future__ import annotations

from typing import Any

import orjson

from cellsight.notifications import limits
from cellsight.notifications.errors import MalformedNotification, TooLarge


def body_size(body: bytes | bytearray | memoryview | str) -> int:
    return len(body) if not isinstance(body, memoryview) else body.nbytes


def parse(body: bytes | bytearray | memoryview | str, what: str = "body") -> Any:
    """The JSON value of ``body``; raises a named error, never the parser's own."""
    if body_size(body) > limits.MAX_BODY_BYTES:
        raise TooLarge(f"{what} is {body_size(body)} bytes, the limit is {limits.MAX_BODY_BYTES}")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        bad = _utf8_error(body)
        if bad is not None:
            # orjson says only "str is not valid UTF-8" at line 1, column 1.
            raise MalformedNotification(
                f"{what} is not UTF-8: {bad.reason} at byte {bad.start} of {len(bad.object)}"
            ) from None
        raise MalformedNotification(f"{what} is not JSON: {exc}") from None


def _utf8_error(body: bytes | bytearray | memoryview | str) -> UnicodeDecodeError | None:
    if isinstance(body, str):
        return None
    try:
        bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc
    return None
