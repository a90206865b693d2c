"""Let the official Elasticsearch 8/9 client talk to an OpenSearch-compatible server.

The client sends ``application/vnd.elasticsearch+json; compatible-with=N`` as Accept and
Content-Type (``ndjson`` for bulk), which OpenSearch-style servers such as osmem answer
with 406, and it refuses any 2xx answer without ``X-Elastic-Product: Elasticsearch``,
which OpenSearch does not send. ``CompatNode`` undoes both at the HTTP layer, below the
client's serializers, so every API and helper of the client runs unchanged:

    ElasticsearchEngine(url, prefix=..., timeout=..., **ES_CLIENT_OPTIONS)

This is a test harness for an engine peer; production talks to real Elasticsearch.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from elastic_transport import HttpHeaders, Urllib3HttpNode
from elastic_transport.client_utils import DEFAULT, DefaultType

if TYPE_CHECKING:  # not re-exported at the package top level
    from elastic_transport._node import NodeApiResponse

_COMPAT_MIMETYPE = re.compile(
    r"application/vnd\.elasticsearch\+([\w-]+)\s*(?:;\s*compatible-with\s*=\s*\d+)?"
)
_PRODUCT_HEADER = "X-Elastic-Product"


def plain_mimetype(value: str) -> str:
    """``application/vnd.elasticsearch+json; compatible-with=9`` → ``application/json``."""
    return _COMPAT_MIMETYPE.sub(r"application/\1", value)


class CompatNode(Urllib3HttpNode):
    """A urllib3 node that sends plain JSON media types and marks answers as Elasticsearch."""

    def perform_request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        headers: HttpHeaders | None = None,
        request_timeout: DefaultType | float | None = DEFAULT,
    ) -> NodeApiResponse:
        if headers is not None:
            # a copy: the transport may hand over its own (possibly frozen) headers
            headers = HttpHeaders(headers)
            for name in ("accept", "content-type"):
                if name in headers:
                    headers[name] = plain_mimetype(headers[name])
        response = super().perform_request(method, target, body, headers, request_timeout)
        if _PRODUCT_HEADER in response.meta.headers:
            return response
        response_headers = HttpHeaders(response.meta.headers)
        response_headers[_PRODUCT_HEADER] = "Elasticsearch"
        meta = dataclasses.replace(response.meta, headers=response_headers)
        return response._replace(meta=meta)


ES_CLIENT_OPTIONS: dict[str, Any] = {"node_class": CompatNode}
"""Keyword arguments for ``Elasticsearch(...)`` / ``ElasticsearchEngine(...)``."""
