"""An encoded slash (``%2F``) in a request path is data, not a separator.

ASGI servers decode the whole path, so ``/v2.1/servers/%2F`` reached the router as
``/v2.1/servers//``: no server route matched, Starlette's trailing-slash redirect
stripped both slashes, and a show of the server id ``/`` answered the list (a fuzzed
server id found it; ``detail%2F`` likewise). Here such a path is decoded except for its
encoded slashes, as Apache's ``AllowEncodedSlashes NoDecode`` does: the id ``%2F`` is
then one path segment, matched by the route it names, and no route's parameter can
hold a slash (a server's uuid, a project, a query resource), so it is an unknown one.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

_ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


class KeepEncodedSlashes:
    """ASGI middleware: ``scope["path"]`` keeps ``%2F`` where ``raw_path`` has one."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and _ENCODED_SLASH.search(raw):
            parts = _ENCODED_SLASH.split(raw.split(b"?", 1)[0])
            path = "%2F".join(unquote(part.decode("latin-1")) for part in parts)
            scope = {**scope, "path": path}
        await self.app(scope, receive, send)
