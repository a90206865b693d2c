"""The REST logic shared by the Elasticsearch and OpenSearch engines.

Both distributions speak the same document, bulk, search, alias and index APIs for
everything Cellsight needs, so ``HttpEngine`` implements ``SearchEngine`` once over raw
REST calls and leaves three small hooks to the client modules: send one request, run the
client's streaming bulk helper, and close. Each hook reports failures in the same two
shapes: ``HttpError`` for an error status (with the engine's JSON body) and
``EngineUnavailable`` for a request that never got an answer.

Index layout (see ``indexer.engines.base``): concrete indexes are named
``<prefix>-<resource>-<UTC timestamp>`` and carry ``_meta.cellsight`` in their mapping
(prefix, resource, creation time, and the replica count to restore after a bulk load),
which is also how ``indexes()`` recognises them. Metadata documents live behind the
``<prefix>-meta`` alias and are written with ``require_alias`` so that a missing meta
index is created with its strict mapping instead of being auto-created dynamic.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from indexer.engines.base import (
    EngineError,
    EngineUnavailable,
    IndexInfo,
    IndexMissing,
    SearchEngine,
    StoredDocument,
    WriteOp,
    WriteResult,
    WriteStatus,
)
from indexer.fields import search_mapping
from indexer.query.dsl import search_body, value
from indexer.query.prepare import keyset
from indexer.query.tree import SearchRequest, total_order

# A bulk header line and its optional source line, as the clients' helpers take them.
BulkAction = tuple[dict[str, Any], dict[str, Any] | None]
# One item of a bulk response: (ok, {op_type: item}).
BulkItem = tuple[bool, dict[str, Any]]

META_KEY = "cellsight"
# Large enough for a few thousand instance documents per request, small enough to stay
# far below http.max_content_length (100 MB) and to keep one request's memory modest.
MAX_CHUNK_BYTES = 10 * 1024 * 1024
# Elasticsearch and OpenSearch refuse from+size beyond index.max_result_window.
MAX_PAGE = 10_000
# Document-level failures that say "this document can never be indexed as it is".
_REJECT_TYPES = frozenset(
    {
        "strict_dynamic_mapping_exception",
        "mapper_parsing_exception",
        "document_parsing_exception",
        "illegal_argument_exception",
    }
)
_META_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        "value": {"type": "object", "enabled": False},
        "updated_at": {"type": "date"},
    },
}


class HttpError(Exception):
    """An error status from the engine, with its decoded body (a dict, or a string)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        self.type, self.reason = error_type_reason(body)
        super().__init__(f"{status} {self.type}: {self.reason}")


def error_type_reason(body: Any) -> tuple[str, str]:
    """The ``(type, reason)`` of an error body or bulk item error, with the cause if any."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if not isinstance(error, dict):
        return "error", str(error)
    kind = str(error.get("type", "error"))
    reason = str(error.get("reason", ""))
    cause = error.get("caused_by")
    # mapper_parsing_exception's own reason names the field; the cause says what was wrong
    if isinstance(cause, dict) and cause.get("reason"):
        reason = f"{reason} ({cause.get('type')}: {cause['reason']})"
    return kind, reason


def classify_item(item: dict[str, Any]) -> WriteResult:
    """One bulk response item → OK, STALE, REJECTED or RETRY."""
    status = int(item.get("status", 500))
    if 200 <= status < 300:
        return WriteResult(WriteStatus.OK)
    kind, reason = error_type_reason(item.get("error") or {})
    if status == 409 and kind == "version_conflict_engine_exception":
        return WriteResult(WriteStatus.STALE)
    if status == 400 or kind in _REJECT_TYPES:
        return WriteResult(WriteStatus.REJECTED, f"{kind}: {reason}")
    # 429, 5xx, 403 (cluster blocks such as the flood-stage read-only block), 404 (the
    # index went away between resolving the alias and writing): the document itself is
    # fine, so it must be written again rather than dead-lettered.
    return WriteResult(WriteStatus.RETRY, f"{status} {kind}: {reason}")


def combine(results: Sequence[WriteResult]) -> WriteResult:
    """One op's outcome over every index it was written to."""
    for status in (WriteStatus.REJECTED, WriteStatus.RETRY):
        for r in results:
            if r.status is status:
                return r
    if results and all(r.status is WriteStatus.STALE for r in results):
        return WriteResult(WriteStatus.STALE)
    return WriteResult(WriteStatus.OK)


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def _doc_path(index: str, doc_id: str) -> str:
    return f"/{index}/_doc/{quote(doc_id, safe='')}"


class HttpEngine(SearchEngine):
    """``SearchEngine`` over the REST API common to Elasticsearch and OpenSearch.

    ``timeout`` bounds every request; bulk requests get ``bulk_timeout`` (default six
    times ``timeout``) because a large bulk legitimately takes longer than a lookup.
    ``replicas`` pins the replica count of new indexes; by default a new index keeps the
    live index's explicit count, or else the cluster default.
    """

    @abc.abstractmethod
    def _make_client(self, url: str, timeout: float, options: dict[str, Any]) -> Any:
        """The client, with ``options`` over the no-retry defaults."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "cellsight",
        timeout: float = 5.0,
        bulk_timeout: float | None = None,
        replicas: int | None = None,
        **client_options: Any,
    ) -> None:
        """``client_options`` go to the client's constructor (auth, TLS, transport). The
        client does not retry: the consumer retries whole batches with backoff, and client
        retries on top would multiply the time a caller waits on a dead cluster."""
        super().__init__(prefix)
        self.client = self._make_client(url, timeout, client_options)
        self.url = redact_url(url)  # for messages; the client is given the real one
        self.timeout = timeout
        self.bulk_timeout = bulk_timeout if bulk_timeout is not None else timeout * 6
        self.replicas = replicas

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r})"

    # Client hooks -------------------------------------------------------------
    @abc.abstractmethod
    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        """The decoded body of a 2xx answer. Raises ``HttpError`` for an error status and
        ``EngineUnavailable`` when the request got no answer (refused, timed out)."""

    @abc.abstractmethod
    def _stream_bulk(
        self, actions: Iterable[BulkAction], *, chunk_size: int, timeout: float
    ) -> Iterator[BulkItem]:
        """The client's streaming bulk helper over ``actions``: one item per action, in
        order, never raising for item errors, with no retries. Request failures are
        raised as in ``_send``."""

    # Requests ---------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        try:
            return self._send(method, path, params=params, body=body)
        except HttpError as exc:
            raise self._translate(method, path, exc) from exc

    def _translate(self, method: str, path: str, exc: HttpError) -> EngineError:
        where = f"{self.distribution} {method} {path}"
        if exc.status == 404 and (
            exc.type in ("index_not_found_exception", "aliases_not_found_exception")
            # GET /_alias/<missing> answers {"error": "alias [x] missing", "status": 404}
            or (exc.type == "error" and "alias" in exc.reason and "missing" in exc.reason)
        ):
            return IndexMissing(f"{where}: {exc.reason}")
        if exc.status in (408, 429) or exc.status >= 500:
            return EngineUnavailable(f"{where}: {exc}")
        return EngineError(f"{where}: {exc}")

    def _bulk_items(self, actions: Sequence[BulkAction]) -> Iterator[BulkItem]:
        """Results of ``actions`` in one request (more only past ``MAX_CHUNK_BYTES``)."""
        try:
            yield from self._stream_bulk(
                actions, chunk_size=max(1, len(actions)), timeout=self.bulk_timeout
            )
        except HttpError as exc:
            raise self._translate("POST", "/_bulk", exc) from exc

    # Names and aliases ------------------------------------------------------------
    def new_index_name(self, resource: str) -> str:
        return f"{self.prefix}-{resource}-{datetime.now(UTC):%Y%m%d%H%M%S%f}"

    def meta_alias(self) -> str:
        return f"{self.prefix}-meta"

    def _alias_indexes(self, alias: str) -> list[str]:
        """The concrete indexes behind ``alias``; ``IndexMissing`` if it does not exist."""
        body = self._request("GET", f"/_alias/{alias}")
        names = sorted(name for name, info in body.items() if isinstance(info, dict))
        if not names:
            raise IndexMissing(f"{self.distribution}: alias [{alias}] points at no index")
        return names

    def _aliases_of(self, resource: str) -> dict[str, set[str]]:
        """Index name → which of this resource's aliases point at it."""
        wanted = (self.read_alias(resource), self.write_alias(resource))
        try:
            body = self._send("GET", f"/_alias/{','.join(wanted)}")
        except HttpError as exc:
            if exc.status != 404:
                raise self._translate("GET", "/_alias", exc) from exc
            # one alias missing: the body still lists the indexes of the other
            body = exc.body if isinstance(exc.body, dict) else {}
        out: dict[str, set[str]] = {}
        for name, info in body.items():
            if isinstance(info, dict):
                out[name] = set(info.get("aliases", {})) & set(wanted)
        return out

    def _creation_dates(self, target: str) -> dict[str, int]:
        body = self._request("GET", f"/{target}/_settings/index.creation_date")
        return {
            name: int(info["settings"]["index"]["creation_date"]) for name, info in body.items()
        }

    def _newest_write_index(self, resource: str) -> str:
        dates = self._creation_dates(self.write_alias(resource))
        return max(dates, key=lambda name: (dates[name], name))

    # Lifecycle --------------------------------------------------------------
    def ping(self) -> None:
        try:
            self._send("GET", "/")
        except HttpError as exc:
            raise EngineUnavailable(f"{self.distribution} at {self.url}: {exc}") from exc

    def ensure_ready(self, resource: str) -> None:
        read, write = self.read_alias(resource), self.write_alias(resource)
        current = self._aliases_of(resource)
        readers = sorted(name for name, aliases in current.items() if read in aliases)
        writers = sorted(name for name, aliases in current.items() if write in aliases)
        if readers or writers:
            # half set up (an interrupted sync, a hand edit): complete it in place
            if not writers:
                self.set_aliases(resource, read=readers[0], write=readers[:1])
            elif not readers:
                self.set_aliases(resource, read=self._newest_write_index(resource), write=writers)
            return
        name = self.new_index_name(resource)
        body = self._index_body(resource, bulk_load=False)
        body["aliases"] = {read: {}, write: {}}
        self._request("PUT", f"/{name}", body=body)
        # Two processes starting together can each create an index; the aliases then
        # span both. Every racer sees the same creation order, so all but the oldest
        # index step back and exactly one survives.
        dates = self._creation_dates(read)
        oldest = min(dates, key=lambda n: (dates[n], n))
        if name != oldest:
            self.drop_index(name)

    # Writes ------------------------------------------------------------------
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
                actions.append(self._versioned_action(index, op))
                owners.append(position)
        per_op: list[list[WriteResult]] = [[] for _ in ops]
        for position, (_ok, item) in zip(owners, self._bulk_items(actions), strict=True):
            per_op[position].append(classify_item(next(iter(item.values()))))
        return [combine(results) for results in per_op]

    @staticmethod
    def _versioned_action(index: str, op: WriteOp) -> BulkAction:
        header = {
            "index": {
                "_index": index,
                "_id": op.id,
                "version": op.version,
                "version_type": "external",
            }
        }
        return header, op.document

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
        self._request("POST", f"/{self.read_alias(resource)},{self.write_alias(resource)}/_refresh")

    # Reads --------------------------------------------------------------------
    def get(self, resource: str, doc_id: str) -> StoredDocument | None:
        path = _doc_path(self.read_alias(resource), doc_id)
        try:
            body = self._send("GET", path)
        except HttpError as exc:
            if exc.status == 404 and isinstance(exc.body, dict) and "found" in exc.body:
                return None
            raise self._translate("GET", path, exc) from exc
        return self._stored(body)

    @staticmethod
    def _stored(hit: dict[str, Any]) -> StoredDocument:
        return StoredDocument(str(hit["_id"]), int(hit["_version"]), hit.get("_source") or {})

    def get_many(self, resource: str, ids: Sequence[str]) -> dict[str, StoredDocument]:
        if not ids:
            return {}
        index = self._newest_write_index(resource)
        body = self._request("POST", f"/{index}/_mget", body={"ids": list(dict.fromkeys(ids))})
        return {doc["_id"]: self._stored(doc) for doc in body.get("docs", []) if doc.get("found")}

    @staticmethod
    def _cell_query(cell_uuid: str | None) -> dict[str, Any]:
        if cell_uuid is None:
            return {"match_all": {}}
        return {"term": {"cell_uuid": cell_uuid}}

    def count(self, resource: str, cell_uuid: str | None = None) -> int:
        path = f"/{self.read_alias(resource)}/_count"
        body = self._request("POST", path, body={"query": self._cell_query(cell_uuid)})
        return int(body["count"])

    def iter_versions(
        self, resource: str, cell_uuid: str | None = None, batch_size: int = 5000
    ) -> Iterator[tuple[str, int]]:
        # Sort on the uuid keyword, not _id: sorting on _id needs fielddata that
        # Elasticsearch 8+ disables by default. Documents' ids are their uuid.
        query: dict[str, Any] = {
            "query": self._cell_query(cell_uuid),
            "sort": [{"uuid": "asc"}],
            "size": max(1, min(batch_size, MAX_PAGE)),
            "_source": False,
            "version": True,
            "track_total_hits": False,
        }
        path = f"/{self.read_alias(resource)}/_search"
        while True:
            hits = self._request("POST", path, body=query)["hits"]["hits"]
            for hit in hits:
                yield str(hit["_id"]), int(hit["_version"])
            if len(hits) < query["size"]:
                return
            query["search_after"] = hits[-1]["sort"]

    def search(self, resource: str, request: SearchRequest) -> list[StoredDocument]:
        # The keyset is part of the query (see indexer.query.dsl), so a page larger than
        # MAX_PAGE is fetched as further keyset pages of the same total order.
        path = f"/{self.read_alias(resource)}/_search"
        order = total_order(request.order)
        out: list[StoredDocument] = []
        after = request.after
        while len(out) < request.limit:
            want = min(request.limit - len(out), MAX_PAGE)
            page = SearchRequest(request.filter, order, want, after)
            hits = self._request("POST", path, body=search_body(page, resource))["hits"]["hits"]
            out.extend(self._stored(hit) for hit in hits)
            if len(hits) < want:
                break
            after = keyset(order, out[-1].document)
        return out

    def iter_tombstones(self, resource: str, deleted_before: datetime) -> Iterator[str]:
        if deleted_before.tzinfo is None:
            deleted_before = deleted_before.replace(tzinfo=UTC)
        query: dict[str, Any] = {
            "query": {
                "bool": {
                    "filter": [
                        {"term": {"deleted": True}},
                        {"range": {"deleted_at": {"lt": value(deleted_before)}}},
                    ]
                }
            },
            # a keyword sort value (the id itself) is exact in search_after
            "sort": [{"uuid": "asc"}],
            "size": 1000,
            "_source": False,
            "track_total_hits": False,
        }
        path = f"/{self.read_alias(resource)}/_search"
        while True:
            hits = self._request("POST", path, body=query)["hits"]["hits"]
            for hit in hits:
                yield str(hit["_id"])
            if len(hits) < query["size"]:
                return
            query["search_after"] = hits[-1]["sort"]

    # Index management -------------------------------------------------------------
    def _live_replicas(self, resource: str) -> int | None:
        """The explicit replica count of the index behind the read alias, if any."""
        try:
            body = self._send(
                "GET", f"/{self.read_alias(resource)}/_settings/index.number_of_replicas"
            )
        except HttpError as exc:
            if exc.status == 404:
                return None
            raise self._translate("GET", "/_settings", exc) from exc
        for info in body.values():
            value = info.get("settings", {}).get("index", {}).get("number_of_replicas")
            if value is not None:
                return int(value)
        return None

    def _index_body(self, resource: str, *, bulk_load: bool) -> dict[str, Any]:
        replicas = self.replicas if self.replicas is not None else self._live_replicas(resource)
        mapping = search_mapping(resource)
        mapping["_meta"] = {
            META_KEY: {
                "prefix": self.prefix,
                "resource": resource,
                "created_at": datetime.now(UTC).isoformat(),
                # what finish_bulk_load restores; None: the cluster default
                "replicas": replicas,
            }
        }
        index_settings: dict[str, Any] = {}
        if bulk_load:
            index_settings.update(refresh_interval="-1", number_of_replicas=0)
        elif replicas is not None:
            index_settings["number_of_replicas"] = replicas
        return {"settings": {"index": index_settings}, "mappings": mapping}

    def create_index(self, resource: str, name: str, *, bulk_load: bool = False) -> None:
        self._request("PUT", f"/{name}", body=self._index_body(resource, bulk_load=bulk_load))

    def _index_meta(self, name: str) -> dict[str, Any]:
        body = self._request("GET", f"/{name}/_mapping")
        mappings = body.get(name, {}).get("mappings", {})
        meta = mappings.get("_meta", {}).get(META_KEY, {})
        return dict(meta) if isinstance(meta, dict) else {}

    def finish_bulk_load(self, name: str) -> None:
        replicas = self._index_meta(name).get("replicas")
        self._request(
            "PUT",
            f"/{name}/_settings",
            body={"index": {"refresh_interval": "1s", "number_of_replicas": replicas}},
        )
        # searchable now, not a refresh interval after the read alias moves here
        self._request("POST", f"/{name}/_refresh")

    def drop_index(self, name: str) -> None:
        try:
            self._send("DELETE", f"/{name}")
        except HttpError as exc:
            if exc.status != 404:
                raise self._translate("DELETE", f"/{name}", exc) from exc

    def indexes(self, resource: str) -> list[IndexInfo]:
        body = self._request(
            "GET",
            f"/{self.prefix}-*",
            params={"allow_no_indices": "true", "ignore_unavailable": "true"},
        )
        read, write = self.read_alias(resource), self.write_alias(resource)
        out = []
        for name, info in sorted(body.items()):
            meta = info.get("mappings", {}).get("_meta", {}).get(META_KEY)
            if not isinstance(meta, dict):
                continue
            if meta.get("prefix") != self.prefix or meta.get("resource") != resource:
                continue
            aliases = info.get("aliases", {})
            docs = self._request("POST", f"/{name}/_count")["count"]
            out.append(
                IndexInfo(name, resource, int(docs), read in aliases, write in aliases, dict(meta))
            )
        return out

    def set_aliases(self, resource: str, *, read: str, write: Sequence[str]) -> None:
        if not write:
            raise EngineError("set_aliases: the write alias needs at least one index")
        read_alias, write_alias = self.read_alias(resource), self.write_alias(resource)
        wanted = {read_alias: {read}, write_alias: set(write)}
        actions: list[dict[str, Any]] = []
        current = self._aliases_of(resource)
        for index, aliases in sorted(current.items()):
            for alias in sorted(aliases):
                if index not in wanted[alias]:
                    actions.append({"remove": {"index": index, "alias": alias}})
        for alias, indexes in wanted.items():
            for index in sorted(indexes):
                if alias not in current.get(index, set()):
                    actions.append({"add": {"index": index, "alias": alias}})
        if actions:
            # one request: the cluster applies all actions atomically
            self._request("POST", "/_aliases", body={"actions": actions})

    def bulk_index(
        self, name: str, docs: Iterator[WriteOp], chunk_size: int = 2000
    ) -> Iterator[WriteResult]:
        # Bulk would auto-create a missing index with a dynamic mapping: check first.
        self._request("GET", f"/{name}/_settings/index.creation_date")
        actions = (self._versioned_action(name, op) for op in docs)
        try:
            for _ok, item in self._stream_bulk(
                actions, chunk_size=chunk_size, timeout=self.bulk_timeout
            ):
                yield classify_item(next(iter(item.values())))
        except HttpError as exc:
            raise self._translate("POST", "/_bulk", exc) from exc

    # Metadata ------------------------------------------------------------------
    def get_meta(self, key: str) -> dict[str, Any] | None:
        path = _doc_path(self.meta_alias(), key)
        try:
            body = self._send("GET", path)
        except HttpError as exc:
            if exc.status == 404:  # no such key, or no meta index yet
                return None
            raise self._translate("GET", path, exc) from exc
        value = body.get("_source", {}).get("value")
        return dict(value) if isinstance(value, dict) else None

    def put_meta(self, key: str, value: dict[str, Any]) -> None:
        path = _doc_path(self.meta_alias(), key)
        doc = {"value": value, "updated_at": datetime.now(UTC).isoformat()}
        params = {"require_alias": "true"}
        try:
            self._send("PUT", path, params=params, body=doc)
            return
        except HttpError as exc:
            if exc.status != 404:
                raise self._translate("PUT", path, exc) from exc
        self._create_meta_index()
        self._request("PUT", path, params=params, body=doc)

    def _create_meta_index(self) -> None:
        name = f"{self.meta_alias()}-{datetime.now(UTC):%Y%m%d%H%M%S%f}"
        body = {
            "settings": {"index": {"number_of_shards": 1}},
            "mappings": _META_MAPPING,
            "aliases": {self.meta_alias(): {}},
        }
        self._request("PUT", f"/{name}", body=body)
        dates = self._creation_dates(self.meta_alias())
        if len(dates) > 1:  # a concurrent writer created one too: keep the oldest
            oldest = min(dates, key=lambda n: (dates[n], n))
            if name != oldest:
                self.drop_index(name)

    # Bulk sync and anti-entropy ------------------------------------------------------
    def count_index(self, name: str, cell_uuid: str | None = None) -> int:
        # A bulk-loaded index is only searchable as of its last refresh.
        self._request("POST", f"/{name}/_refresh")
        query = {"query": self._cell_query(cell_uuid)}
        return int(self._request("POST", f"/{name}/_count", body=query)["count"])

    def iter_index_versions(
        self, name: str, cell_uuid: str | None = None, batch_size: int = 5000
    ) -> Iterator[tuple[str, int]]:
        self._request("POST", f"/{name}/_refresh")
        query: dict[str, Any] = {
            "query": self._cell_query(cell_uuid),
            "sort": [{"uuid": "asc"}],  # as iter_versions: not _id, which needs fielddata
            "size": max(1, min(batch_size, MAX_PAGE)),
            "_source": False,
            "version": True,
            "track_total_hits": False,
        }
        while True:
            hits = self._request("POST", f"/{name}/_search", body=query)["hits"]["hits"]
            for hit in hits:
                yield str(hit["_id"]), int(hit["_version"])
            if len(hits) < query["size"]:
                return
            query["search_after"] = hits[-1]["sort"]

    def swap_meta(self, key: str, expected: dict[str, Any] | None, value: dict[str, Any]) -> bool:
        path = _doc_path(self.meta_alias(), key)
        doc = {"value": value, "updated_at": datetime.now(UTC).isoformat()}
        for _attempt in range(20):
            try:
                current: dict[str, Any] | None = self._send("GET", path)
            except HttpError as exc:
                if exc.status == 400 and "more than one index" in exc.reason:
                    time.sleep(0.05)  # racers creating the meta index: see below
                    continue
                if exc.status != 404:  # 404: no such key, or no meta index yet
                    raise self._translate("GET", path, exc) from exc
                current = None
            found = bool(current and current.get("found"))
            stored = (current or {}).get("_source", {}).get("value") if found else None
            if stored != expected:
                return False
            # Optimistic concurrency: the write fails (409) if anyone wrote in between.
            params = {"require_alias": "true"}
            if found and current is not None:
                params["if_seq_no"] = str(current["_seq_no"])
                params["if_primary_term"] = str(current["_primary_term"])
            else:
                params["op_type"] = "create"
            try:
                self._send("PUT", path, params=params, body=doc)
                return True
            except HttpError as exc:
                if exc.status == 409:
                    return False
                if exc.status == 404 and not found:
                    self._create_meta_index()  # then compare again from the start
                    continue
                if exc.status == 400 and "write index" in exc.reason:
                    # Racers creating the meta index at once: for a moment the alias
                    # spans two; all but the oldest are being dropped. Start over.
                    time.sleep(0.05)
                    continue
                raise self._translate("PUT", path, exc) from exc
        raise EngineUnavailable(f"{self.distribution}: could not settle meta key {key!r}")
