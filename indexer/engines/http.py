"""``SearchEngine`` over the REST API common to Elasticsearch and OpenSearch.

Both distributions speak the same document, bulk, search, alias and index APIs for
everything Cellsight needs, so ``HttpEngine`` is written once, by role (``http_documents``,
``http_search``, ``http_admin``, ``http_meta`` over ``http_core``), and the client modules
(``elasticsearch``, ``opensearch``) only adapt their client: send one request, run the
client's streaming bulk helper, open and close a point in time, classify its errors.
"""

from __future__ import annotations

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.engines.http_admin import HttpAdmin
from cellsight.indexer.engines.http_core import MAX_CHUNK_BYTES, BulkAction, BulkItem
from cellsight.indexer.engines.http_documents import HttpDocuments
from cellsight.indexer.engines.http_meta import HttpMeta
from cellsight.indexer.engines.http_search import HttpSearch
from cellsight.urls import redact_url

__all__ = ["MAX_CHUNK_BYTES", "BulkAction", "BulkItem", "HttpEngine", "redact_url"]


class HttpEngine(HttpDocuments, HttpSearch, HttpAdmin, HttpMeta, SearchEngine):
    """Every role on an Elasticsearch or OpenSearch cluster; see ``HttpCore`` for the
    constructor's options."""
