"""The ``engine`` fixture: every engine, so one contract suite runs unchanged on each;
``each_bus``: settings on each real bus (RabbitMQ, the embedded Redis bus).

``embedded`` is a fresh SQLite file. ``elasticsearch`` and ``opensearch`` run against a
per-test clone of the session's osmem server (an in-memory OpenSearch-compatible
server); the Elasticsearch client reaches it through ``tests.support.es_compat``. Every
engine gets a unique prefix, so nothing a test leaves behind can leak into another.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.settings import Settings
from tests.support.es_compat import ES_CLIENT_OPTIONS
from tests.support.indexing import bus_settings
from tests.support.services import osmem_clone_url

ENGINES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("elasticsearch", id="elasticsearch", marks=pytest.mark.services),
    pytest.param("opensearch", id="opensearch", marks=pytest.mark.services),
]


def _http_engine(kind: str, url: str, prefix: str) -> SearchEngine:
    if kind == "opensearch":
        from cellsight.indexer.engines.opensearch import OpenSearchEngine

        return OpenSearchEngine(url, prefix=prefix, timeout=10.0)
    from cellsight.indexer.engines.elasticsearch import ElasticsearchEngine

    # osmem answers the Elasticsearch client's compatibility media type with 406.
    return ElasticsearchEngine(url, prefix=prefix, timeout=10.0, **ES_CLIENT_OPTIONS)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SearchEngine]:
    kind = str(request.param)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if kind == "embedded":
        eng: SearchEngine = EmbeddedEngine(tmp_path / "index.db", prefix=prefix)
    else:
        eng = _http_engine(kind, osmem_clone_url(request), prefix)
    yield eng
    eng.close()


@pytest.fixture(params=["rabbitmq", "embedded"])
def each_bus(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Settings on RabbitMQ (a stream of the test's own) or the embedded bus in tmp_path."""
    if request.param == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")
    return bus_settings(tmp_path / "data", str(request.param))
