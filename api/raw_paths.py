"""A request path's segments are decoded as data: an encoded slash stays one, and a
segment that is not UTF-8 once decoded is kept as it was sent.

ASGI servers decode the whole path, so ``/v2.1/servers/%2F`` reached the router as
``/v2.1/servers//``: no server route matched, Starlette's trailing-slash redirect
stripped both slashes, and a show of the server id ``/`` answered the list (a fuzzed
server id found it; ``detail%2F`` likewise). Here such a path is decoded except for its
encoded slashes, as Apache's ``AllowEncodedSlashes NoDecode`` does: the id ``%2F`` is
then one path segment, matched by the route it names, and no route's parameter can
hold a slash (a server's uuid, a project, a query resource), so it is an unknown one.

The servers decode bytes that are not UTF-8 as U+FFFD, so ``/v2.1/servers/%ff`` and
``/v2.1/servers/%fe`` were both "Instance \ufffd could not be found": the error named
neither id. Such a segment reaches the routes percent-encoded as sent, so the 404 names
``%ff``; no uuid, resource or route name has a byte outside UTF-8, so none is matched.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_to_bytes

_ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


def decoded_path(raw: bytes) -> str | None:
    """The path to route ``raw`` (a request's ``raw_path``) by, or None when the
    server's own decoding is already right (nothing encoded that it would mistake)."""
    raw = raw.split(b"?", 1)[0]
    if b"%" not in raw:
        return None
    changed = False
    segments = []
    for segment in raw.split(b"/"):
        try:
            parts = [unquote_to_bytes(p).decode("utf-8") for p in _ENCODED_SLASH.split(segment)]
        except UnicodeDecodeError:
            segments.append(segment.decode("latin-1"))
            changed = True
            continue
        changed = changed or len(parts) > 1
        segments.append("%2F".join(parts))
    return "/".join(segments) if changed else None


class PathSegmentsAsData:
    """ASGI middleware: ``scope["path"]`` keeps ``%2F`` where ``raw_path`` has one, and a
    segment that does not decode to UTF-8 as it was sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and (path := decoded_path(raw)) is not None:
            scope = {**scope, "path": path}
        await self.app(scope, receive, send)
