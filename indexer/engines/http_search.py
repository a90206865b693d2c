"""Queries and scans on the HTTP engines. Scans go through ``HttpCore._scan``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from cellsight.indexer.engines.base import StoredDocument
from cellsight.indexer.engines.http_core import MAX_PAGE, HttpCore
from cellsight.indexer.engines.http_documents import stored
from cellsight.indexer.fields import field_map
from cellsight.query.dsl import search_body, value
from cellsight.query.prepare import keyset
from cellsight.query.tree import SearchRequest, total_order


def cell_query(cell_uuid: str | None) -> dict[str, Any]:
    if cell_uuid is None:
        return {"match_all": {}}
    return {"term": {"cell_uuid": cell_uuid}}


class HttpSearch(HttpCore):
    def count(
        self, resource: str, cell_uuid: str | None = None, *, index: str | None = None
    ) -> int:
        target = self._target(resource, index)
        body = self._send("POST", f"/{target}/_count", body={"query": cell_query(cell_uuid)})
        return int(body["count"])

    def iter_versions(
        self,
        resource: str,
        cell_uuid: str | None = None,
        batch_size: int = 5000,
        *,
        index: str | None = None,
    ) -> Iterator[tuple[str, int]]:
        target = self._target(resource, index)
        for hit in self._scan(target, cell_query(cell_uuid), size=batch_size):
            yield str(hit["_id"]), int(hit["_version"])

    def iter_tombstones(self, resource: str, deleted_before: datetime) -> Iterator[str]:
        if deleted_before.tzinfo is None:
            deleted_before = deleted_before.replace(tzinfo=UTC)
        query = {
            "bool": {
                "filter": [
                    {"term": {"deleted": True}},
                    {"range": {"deleted_at": {"lt": value(deleted_before)}}},
                ]
            }
        }
        for hit in self._scan(self.read_alias(resource), query, size=1000):
            yield str(hit["_id"])

    def search(self, resource: str, request: SearchRequest) -> list[StoredDocument]:
        # The keyset is part of the query (see cellsight.query.dsl), so a page larger than
        # MAX_PAGE is fetched as further keyset pages of the same total order.
        path = f"/{self.read_alias(resource)}/_search"
        order = total_order(request.order)
        out: list[StoredDocument] = []
        after = request.after
        fields = field_map(resource)
        while len(out) < request.limit:
            want = min(request.limit - len(out), MAX_PAGE)
            page = SearchRequest(request.filter, order, want, after)
            hits = self._send("POST", path, body=search_body(page, fields))["hits"]["hits"]
            out.extend(stored(hit) for hit in hits)
            if len(hits) < want:
                break
            after = keyset(order, out[-1].document)
        return out
