"""The ``engine`` fixture: every engine, so one contract suite runs unchanged on each.

``embedded`` is a fresh SQLite file. ``elasticsearch`` and ``opensearch`` run against a
per-test clone of the session's osmem server (an in-memory OpenSearch-compatible
server); the Elasticsearch client reaches it through ``tests.support.es_compat``. Every
engine gets a unique prefix, so nothing a test leaves behind can leak into another.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from indexer.engines.base import SearchEngine
from indexer.engines.embedded import EmbeddedEngine

REQUIRE_SERVICES = os.environ.get("CELLSIGHT_REQUIRE_SERVICES") == "1"

ENGINES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("elasticsearch", id="elasticsearch", marks=pytest.mark.services),
    pytest.param("opensearch", id="opensearch", marks=pytest.mark.services),
]


def _osmem_url(request: pytest.FixtureRequest) -> str:
    """A fresh clone of the session's osmem server, closed after the test."""
    try:
        server: Any = request.getfixturevalue("osmem_server")
    except Exception as exc:  # the plugin raises OsmemError, or the fixture is absent
        message = f"osmem-server unavailable: {exc}"
        if REQUIRE_SERVICES:
            pytest.fail(f"{message} (CELLSIGHT_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    clone = server.clone()
    request.addfinalizer(clone.close)
    return str(clone.url)


def _http_engine(kind: str, url: str, prefix: str) -> SearchEngine:
    if kind == "opensearch":
        from indexer.engines.opensearch import OpenSearchEngine

        return OpenSearchEngine(url, prefix=prefix, timeout=10.0)
    from indexer.engines.elasticsearch import ElasticsearchEngine

    try:
        # osmem answers the Elasticsearch client's compatibility media type with 406.
        from tests.support.es_compat import ES_CLIENT_OPTIONS
    except ImportError as exc:
        pytest.fail(f"tests.support.es_compat (the ES client's osmem transport) is needed: {exc}")
    return ElasticsearchEngine(url, prefix=prefix, timeout=10.0, **ES_CLIENT_OPTIONS)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SearchEngine]:
    kind = str(request.param)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if kind == "embedded":
        eng: SearchEngine = EmbeddedEngine(tmp_path / "index.db", prefix=prefix)
    else:
        eng = _http_engine(kind, _osmem_url(request), prefix)
    yield eng
    eng.close()
