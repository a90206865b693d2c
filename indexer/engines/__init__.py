"""Search engines, and ``build_engine``, which picks one from a URL.

No URL means the embedded engine (a SQLite file, no server). An ``http(s)://`` URL is
asked what it is with a plain ``GET /``: the Elasticsearch client refuses servers that
are not Elasticsearch, so it cannot be the one to ask.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from http.client import HTTPException  # by name: this package's own ``http`` shadows it
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, unquote

from cellsight.indexer.engines.base import (
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    SearchEngine,
)
from cellsight.urls import redact_url, split_url

if TYPE_CHECKING:
    from email.message import Message

__all__ = ["UnsupportedEngineURL", "build_engine", "check_url", "detect_distribution"]

SCHEMES = ("http", "https")


class UnsupportedEngineURL(EngineError, ValueError):
    """The search URL's scheme names no engine Cellsight has."""


def build_engine(
    url: str | None,
    *,
    embedded_path: str | os.PathLike[str],
    prefix: str = "cellsight",
    timeout: float = 5.0,
) -> SearchEngine:
    """The engine for ``url``: embedded at ``embedded_path`` when ``url`` is empty,
    otherwise Elasticsearch or OpenSearch as the cluster at ``url`` reports itself."""
    if not url:
        from cellsight.indexer.engines.embedded import EmbeddedEngine

        return EmbeddedEngine(embedded_path, prefix=prefix, timeout=timeout)
    distribution = detect_distribution(url, timeout=timeout)
    if distribution == "opensearch":
        from cellsight.indexer.engines.opensearch import OpenSearchEngine

        return OpenSearchEngine(url, prefix=prefix, timeout=timeout)
    from cellsight.indexer.engines.elasticsearch import ElasticsearchEngine

    return ElasticsearchEngine(url, prefix=prefix, timeout=timeout)


def check_url(url: str) -> SplitResult:
    """``url`` split, or ``UnsupportedEngineURL`` saying what is wrong with it (the
    password masked): not http(s), no host, a host or port that does not parse. The
    settings check ``search_url`` with it; ``detect_distribution`` again before use."""
    shown = redact_url(url)
    try:
        parts = split_url(url)
    except ValueError as exc:
        raise UnsupportedEngineURL(f"search engine URL {shown!r}: {exc}") from None
    if parts.scheme.lower() not in SCHEMES or not parts.hostname:
        raise UnsupportedEngineURL(
            f"search engine URL {shown!r}: expected http://host:port or https://host:port "
            "of an Elasticsearch 8/9 or OpenSearch 2/3 cluster, or nothing for the "
            "embedded engine"
        )
    return parts


def detect_distribution(url: str, *, timeout: float = 5.0) -> str:
    """``"elasticsearch"`` or ``"opensearch"``, from the cluster's root endpoint.

    Raises ``UnsupportedEngineURL`` for a scheme other than http(s),
    ``EngineUnavailable`` when nothing answers there (``EngineTimeout`` when nothing
    answers in ``timeout``), and ``EngineError`` when what answers is neither (or refuses
    to say).
    """
    shown = redact_url(url)
    parts = check_url(url)
    hostname = parts.hostname or ""  # check_url refused a URL without one
    host = hostname if ":" not in hostname else f"[{hostname}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    root = f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}/"
    headers = {"Accept": "application/json"}
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    request = urllib.request.Request(root, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, response_headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, response_headers, raw = exc.code, exc.headers, exc.read()
    except (OSError, ValueError) as exc:  # URLError, refused, timeout, bad TLS
        reason = getattr(exc, "reason", exc)
        # No answer in time (connecting, or reading): a busy engine, which a maintenance
        # command waits out (``cellsight.clients.build_engine``); a refusal fails at once.
        kind = EngineTimeout if isinstance(reason, TimeoutError) else EngineUnavailable
        raise kind(f"search engine at {shown} is unreachable: {reason}") from exc
    except HTTPException as exc:
        # Something listens there but does not speak HTTP (a probe: an internal error
        # whose message was the peer's raw bytes, control characters and all).
        raise EngineError(
            f"search engine at {shown} answered GET /, but not in HTTP ({type(exc).__name__}): "
            "is search_url the engine's HTTP port?"
        ) from exc
    return _distribution(shown, status, response_headers, raw)


def _distribution(shown: str, status: int, headers: Message, raw: bytes) -> str:
    if status == 429 or status >= 500:
        raise EngineUnavailable(f"search engine at {shown} answered GET / with {status}")
    try:
        body: Any = json.loads(raw or b"{}")
    except ValueError:
        body = None
    version = body.get("version") if isinstance(body, dict) else None
    version = version if isinstance(version, dict) else {}
    if version.get("distribution") == "opensearch":
        return "opensearch"
    # Elasticsearch names itself in this header on every answer (even a 401), and
    # OpenSearch never does on its own; osmem sends it too but also says "opensearch".
    if headers.get("X-Elastic-Product") == "Elasticsearch" or (
        status < 300 and "number" in version and "distribution" not in version
    ):
        _check_client_supports(shown, str(version.get("number", "")))
        return "elasticsearch"
    if status in (401, 403):
        raise EngineError(
            f"search engine at {shown} refused GET / ({status}): give credentials in the "
            "URL (https://user:password@host:port)"
        )
    raise EngineError(
        f"{shown} answered GET / with {status} but is neither Elasticsearch nor OpenSearch"
    )


def _check_client_supports(shown: str, server_version: str) -> None:
    """Refuse an Elasticsearch older than the client's major version.

    The official client asks for its own major's REST compatibility, which a server one
    major older rejects on every request; a newer server accepts it.
    """
    from elasticsearch import __versionstr__ as client_version

    server_major = server_version.partition(".")[0]
    client_major = client_version.partition(".")[0]
    if server_major.isdigit() and int(server_major) < int(client_major):
        raise EngineError(
            f"Elasticsearch {server_version} at {shown} needs the elasticsearch "
            f"{server_major}.x Python client; {client_version} is installed"
        )
