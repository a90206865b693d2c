"""Helpers of the HTTP engine tests (``tests/indexer/test_http_engines.py`` and
``test_http_engine_outages.py``): an engine of either kind, a write, and the types of the
canned HTTP server's handlers (the ``canned`` fixture is in ``tests/indexer/conftest.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.elasticsearch import ElasticsearchEngine
from cellsight.indexer.engines.http import HttpEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from tests.support.es_compat import ES_CLIENT_OPTIONS


def make_engine(
    kind: str, url: str, *, prefix: str = "t", timeout: float = 5.0, **kwargs: Any
) -> HttpEngine:
    if kind == "elasticsearch":
        return ElasticsearchEngine(
            url, prefix=prefix, timeout=timeout, **ES_CLIENT_OPTIONS, **kwargs
        )
    return OpenSearchEngine(url, prefix=prefix, timeout=timeout, **kwargs)


def op(doc_id: str, version: int, **fields: Any) -> WriteOp:
    return WriteOp("instance", doc_id, version, {"uuid": doc_id, "version": version, **fields})


Reply = tuple[int, dict[str, str], Any]
Handler = Callable[[str, str, Mapping[str, str], bytes], Reply]
