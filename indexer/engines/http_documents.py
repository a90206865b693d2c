"""Documents read and write on the HTTP engines: versioned bulk, purge, get, and the
bulk-sync stream into one concrete index."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import quote

from cellsight.indexer.engines.base import (
    EngineUnavailable,
    IndexMissing,
    StoredDocument,
    WriteOp,
    WriteResult,
)
from cellsight.indexer.engines.http_core import BulkAction, BulkItem, HttpCore
from cellsight.indexer.engines.http_errors import classify_item, combine


def doc_path(index: str, doc_id: str) -> str:
    return f"/{index}/_doc/{quote(doc_id, safe='')}"


def versioned_action(index: str, op: WriteOp) -> BulkAction:
    kind = "external_gte" if op.same_version else "external"
    header = {"index": {"_index": index, "_id": op.id, "version": op.version, "version_type": kind}}
    return header, op.document


def stored(hit: dict[str, Any]) -> StoredDocument:
    return StoredDocument(str(hit["_id"]), int(hit["_version"]), hit.get("_source") or {})


class HttpDocuments(HttpCore):
    def _bulk_items(self, actions: Sequence[BulkAction]) -> Iterator[BulkItem]:
        """Results of ``actions`` in one request (more only past ``MAX_CHUNK_BYTES``)."""
        yield from self._stream_bulk(
            actions, chunk_size=max(1, len(actions)), timeout=self.bulk_timeout
        )

    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        if not ops:
            return []
        targets = {
            resource: self._alias_indexes(self.write_alias(resource))
            for resource in sorted({op.resource for op in ops})
        }
        actions: list[BulkAction] = []
        owners: list[int] = []
        for position, op in enumerate(ops):
            for index in targets[op.resource]:
                actions.append(versioned_action(index, op))
                owners.append(position)
        per_op: list[list[WriteResult]] = [[] for _ in ops]
        for position, (_ok, item) in zip(owners, self._bulk_items(actions), strict=True):
            per_op[position].append(classify_item(next(iter(item.values()))))
        return [combine(results) for results in per_op]

    def delete(self, resource: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        indexes = sorted(
            {
                *self._alias_indexes(self.read_alias(resource)),
                *self._alias_indexes(self.write_alias(resource)),
            }
        )
        actions: list[BulkAction] = [
            ({"delete": {"_index": index, "_id": doc_id}}, None)
            for doc_id in ids
            for index in indexes
        ]
        removed: set[str] = set()
        for _ok, item in self._bulk_items(actions):
            result = next(iter(item.values()))
            status = int(result.get("status", 500))
            if 200 <= status < 300 and result.get("result") == "deleted":
                removed.add(str(result["_id"]))
            elif status != 404:  # 404: not in this index, nothing to remove
                outcome = classify_item(result)
                raise EngineUnavailable(f"delete {result.get('_id')}: {outcome.reason}")
        return len(removed)

    def refresh(self, resource: str) -> None:
        self._send("POST", f"/{self.read_alias(resource)},{self.write_alias(resource)}/_refresh")

    def get(self, resource: str, doc_id: str) -> StoredDocument | None:
        try:
            body = self._send("GET", doc_path(self.read_alias(resource), doc_id))
        except IndexMissing as exc:
            if isinstance(exc.body, dict) and "found" in exc.body:  # the index is there
                return None
            raise
        return stored(body)

    def get_many(
        self,
        resource: str,
        ids: Sequence[str],
        *,
        fields: Sequence[str] | None = None,
        index: str | None = None,
    ) -> dict[str, StoredDocument]:
        if not ids:
            return {}
        # Every index behind the write alias, the highest version of each id: during a
        # sync the new index lacks what it has not loaded yet.
        indexes = [index] if index is not None else self._alias_indexes(self.write_alias(resource))
        params = None if fields is None else {"_source_includes": ",".join(fields)}
        unique = list(dict.fromkeys(ids))
        request: dict[str, Any]
        if len(indexes) == 1:
            request = {"ids": unique}
            path = f"/{indexes[0]}/_mget"
        else:
            request = {"docs": [{"_index": i, "_id": d} for i in indexes for d in unique]}
            path = "/_mget"
        body = self._send("POST", path, params=params, body=request)
        out: dict[str, StoredDocument] = {}
        for doc in body.get("docs", []):
            if (
                index is not None
                and doc.get("error", {}).get("type") == "index_not_found_exception"
            ):
                # mget answers a missing index per document; the embedded engine raises.
                raise IndexMissing(f"{self.distribution}: index [{index}] does not exist")
            if doc.get("found"):
                s = stored(doc)
                if s.id not in out or s.version > out[s.id].version:
                    out[s.id] = s
        return out

    def bulk_index(
        self,
        name: str,
        docs: Iterator[WriteOp],
        chunk_size: int = 2000,
        *,
        lock: AbstractContextManager[Any] | None = None,
    ) -> Iterator[WriteResult]:
        # ``lock`` is not needed: the cluster takes concurrent bulk requests.
        # Bulk would auto-create a missing index with a dynamic mapping: check first.
        self._send("GET", f"/{name}/_settings/index.creation_date")
        actions = (versioned_action(name, op) for op in docs)
        for _ok, item in self._stream_bulk(
            actions, chunk_size=chunk_size, timeout=self.bulk_timeout
        ):
            yield classify_item(next(iter(item.values())))
