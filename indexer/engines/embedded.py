"""The default engine: the index in one SQLite file (layout in ``sqlite_schema``).

Durability: WAL with ``synchronous=NORMAL``. A commit is atomic and survives a crash of
the process; a power loss can drop the last commits since the WAL was last synced. That
is safe here, because the index is derived data: the consumer acks only after a commit,
lost tail writes are redelivered or repaired by the anti-entropy check. Pass
``synchronous="FULL"`` to sync every commit.

Concurrency: one connection per thread (the API reads from a thread pool) and WAL, so
readers never block the writer or each other. Every write runs in ``BEGIN IMMEDIATE``:
the indexer and a bulk sync in another process serialise on SQLite's write lock, waiting
up to ``timeout`` seconds before giving up with ``EngineUnavailable``. Versions are read
and compared inside that transaction, so the guard in the upsert never races.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from cellsight.indexer.engines import sqlite_search
from cellsight.indexer.engines.base import (
    Capabilities,
    EngineError,
    EngineUnavailable,
    IndexInfo,
    IndexMissing,
    SearchEngine,
    StoredDocument,
    WriteOp,
    WriteResult,
)
from cellsight.indexer.engines.sqlite_catalog import temp_on_disk
from cellsight.indexer.engines.sqlite_connections import SYNC_MODES, Connections
from cellsight.indexer.engines.sqlite_rows import decode_json
from cellsight.indexer.engines.sqlite_scans import Scans
from cellsight.indexer.engines.sqlite_schema import SCHEMAS, Schema, doc_table, quote, side_table
from cellsight.indexer.engines.sqlite_write import Writer, rejected
from cellsight.query.tree import SearchRequest


class EmbeddedEngine(SearchEngine):
    """The index at ``path`` (e.g. ``Settings.index_path``), created on first use.

    ``timeout`` bounds the wait for SQLite's write lock; ``synchronous`` and ``cache_mb``
    (SQLite's page cache per connection) are this engine's client options.
    """

    distribution = "embedded"
    capabilities = Capabilities(point_in_time=False, max_in_flight=1, worker_processes=True)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        prefix: str = "cellsight",
        timeout: float = 5.0,
        synchronous: str = "NORMAL",
        cache_mb: int = 64,
    ) -> None:
        super().__init__(prefix)
        if synchronous.upper() not in SYNC_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNC_MODES)}")
        self.path = Path(path)
        self.timeout = timeout
        # Seconds one search may run (SQL and regex matching) before EngineUnavailable:
        # the engine's timeout, as the HTTP engines' requests (``search_timeout``).
        self.search_timeout = timeout
        self.synchronous = synchronous.upper()
        self.cache_mb = cache_mb
        self._connections = Connections(
            self.path, prefix, timeout=timeout, synchronous=synchronous.upper(), cache_mb=cache_mb
        )
        self._txn = self._connections.transaction
        self._scans = Scans(self._connections)
        self._writer = Writer(prefix)

    def __repr__(self) -> str:
        return f"EmbeddedEngine({str(self.path)!r}, prefix={self.prefix!r})"

    def reopener(self) -> Callable[[], SearchEngine]:
        return partial(
            EmbeddedEngine,
            str(self.path),
            prefix=self.prefix,
            timeout=self.timeout,
            synchronous=self.synchronous,
            cache_mb=self.cache_mb,
        )

    def _conn(self) -> sqlite3.Connection:
        return self._connections.get()

    def close(self) -> None:
        self._connections.close()

    def store_identity(self) -> Hashable:
        return self._connections.identity_now()

    def ping(self, timeout: float | None = None) -> None:
        try:
            self._conn().execute("SELECT count(*) FROM _cs_indexes").fetchone()
        except sqlite3.Error as exc:
            raise EngineUnavailable(f"index database {self.path}: {exc}") from exc

    # Lifecycle ------------------------------------------------------------------
    def new_index_name(self, resource: str) -> str:
        return f"{self.prefix}-{resource}-{datetime.now(UTC):%Y%m%d%H%M%S%f}"

    def ensure_ready(self, resource: str) -> None:
        schema = _schema(resource)
        read, write = self.read_alias(resource), self.write_alias(resource)
        with self._txn(write=True) as cat:
            current = cat.targets(read)
            if not current:
                name = self.new_index_name(resource)
                cat.create_index(schema, name, bulk_load=False)
                current = [name]
                cat.point(read, current, "read")
            if not cat.targets(write):
                cat.point(write, current, "write")

    def create_index(self, resource: str, name: str, *, bulk_load: bool = False) -> None:
        schema = _schema(resource)
        with self._txn(write=True) as cat:
            cat.create_index(schema, name, bulk_load=bulk_load)

    def finish_bulk_load(self, name: str) -> None:
        with temp_on_disk(self._conn()), self._txn(write=True) as cat:
            cat.finish_bulk_load(_schema(cat.resource_of(name)), name)

    def drop_index(self, name: str) -> None:
        with temp_on_disk(self._conn()), self._txn(write=True) as cat:
            cat.drop_index(name)

    def indexes(self, resource: str) -> list[IndexInfo]:
        _schema(resource)
        with self._txn(write=False) as cat:
            return cat.infos(resource, self.read_alias(resource), self.write_alias(resource))

    def set_aliases(self, resource: str, *, read: str, write: Sequence[str]) -> None:
        if not write:
            raise EngineError("set_aliases: the write alias needs at least one index")
        with self._txn(write=True) as cat:
            for name in (read, *write):
                if cat.resource_of(name) != resource:
                    raise EngineError(f"index {name} does not hold {resource} documents")
            cat.point(self.read_alias(resource), [read], "read")
            cat.point(self.write_alias(resource), list(write), "write")

    # Writes ------------------------------------------------------------------------
    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        if not ops:
            return []
        results: list[WriteResult | None] = [None] * len(ops)
        by_resource: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            by_resource.setdefault(op.resource, []).append(i)
        # Rows are built before the transaction: the write lock is held for SQL only.
        batches = []
        for resource, positions in by_resource.items():
            schema = SCHEMAS.get(resource)
            if schema is None:
                for i in positions:
                    results[i] = rejected(f"unknown resource {resource!r}")
                continue
            items = [(i, ops[i]) for i in positions]
            batches.append((schema, self._writer.prepare(schema, items, results)))
        with self._txn(write=True) as cat:
            for schema, prepared in batches:
                alias = self.write_alias(schema.resource)
                targets = cat.targets(alias)
                if not targets:
                    raise IndexMissing(f"alias {alias} does not exist")
                self._writer.write_prepared(cat.conn, schema, targets, prepared, results)
        return [r or rejected("internal: no result") for r in results]

    def bulk_index(
        self,
        name: str,
        docs: Iterator[WriteOp],
        chunk_size: int = 2000,
        *,
        lock: AbstractContextManager[Any] | None = None,
    ) -> Iterator[WriteResult]:
        with self._txn(write=False) as cat:
            resource = cat.resource_of(name)
        schema = _schema(resource)
        stream = iter(docs)
        while chunk := list(islice(stream, chunk_size)):
            results: list[WriteResult | None] = [None] * len(chunk)
            items: list[tuple[int, WriteOp]] = []
            for i, op in enumerate(chunk):
                if op.resource == resource:
                    items.append((i, op))
                else:
                    results[i] = rejected(f"index {name} holds {resource}, not {op.resource}")
            # Rows are built before taking the write lock: only the SQL holds it.
            prepared = self._writer.prepare(schema, items, results)
            with lock or nullcontext(), self._txn(write=True) as cat:
                self._writer.write_prepared(cat.conn, schema, [name], prepared, results)
            # Yield outside the transaction: the caller must not hold the write lock.
            yield from (r or rejected("internal: no result") for r in results)

    def delete(self, resource: str, ids: Sequence[str]) -> int:
        removed: set[str] = set()
        if not ids:
            return 0
        with self._txn(write=True) as cat:
            indexes = {
                *cat.targets(self.read_alias(resource)),
                *cat.targets(self.write_alias(resource)),
            }
            if not indexes:
                raise IndexMissing(f"alias {self.read_alias(resource)} does not exist")
            for index in sorted(indexes):
                gone = cat.conn.execute(
                    f"DELETE FROM {quote(index)} WHERE id IN (SELECT value FROM json_each(?)) "
                    "RETURNING rid, id",
                    (json.dumps(list(ids)),),
                ).fetchall()
                rids = [(rid,) for rid, _ in gone]
                cat.conn.executemany(f"DELETE FROM {doc_table(index)} WHERE rid = ?", rids)
                cat.conn.executemany(f"DELETE FROM {side_table(index)} WHERE rid = ?", rids)
                removed.update(doc_id for _, doc_id in gone)
        return len(removed)

    def refresh(self, resource: str) -> None:
        # A commit is visible to every reader at once: nothing to do but check the alias.
        with self._txn(write=False) as cat:
            cat.read_index(self.read_alias(resource))

    # Reads ---------------------------------------------------------------------------
    def get(self, resource: str, doc_id: str) -> StoredDocument | None:
        found = self._fetch(self.read_alias(resource), [doc_id], every=False)
        return found.get(doc_id)

    def get_many(
        self,
        resource: str,
        ids: Sequence[str],
        *,
        fields: Sequence[str] | None = None,
        index: str | None = None,
    ) -> dict[str, StoredDocument]:
        # ``fields`` is not applied: cutting them out of the stored JSON in SQLite costs
        # about what decoding the whole document with msgspec does (callgrind, 3,000
        # documents of 1.7 KB, per document: json_each 32.0k instructions, the whole
        # document 32.3k, json_extract of one path 21.7k, json.loads 56.8k).
        if not ids:
            return {}
        return self._fetch(self.write_alias(resource), ids, every=True, index=index)

    def _fetch(
        self, alias: str, ids: Sequence[str], *, every: bool, index: str | None = None
    ) -> dict[str, StoredDocument]:
        """From the read index, or (``every``) from every index behind the alias, the
        highest version of each id: during a sync the new index lacks what it has not
        loaded yet, and the writer must not take that for no document. ``index``: that
        concrete index alone."""
        found: dict[str, tuple[int, str]] = {}
        with self._txn(write=False) as cat:
            if index is not None:
                cat.resource_of(index)  # IndexMissing unless it exists
                indexes = [index]
            else:
                indexes = cat.targets(alias) if every else [cat.read_index(alias)]
            for name in indexes:
                for doc_id, version, doc in cat.conn.execute(
                    f"SELECT t.id, t.version, d.doc FROM {quote(name)} t "
                    f"JOIN {doc_table(name)} d ON d.rid = t.rid "
                    "WHERE t.id IN (SELECT value FROM json_each(?))",
                    (json.dumps(list(ids)),),
                ):
                    if doc_id not in found or version > found[doc_id][0]:
                        found[doc_id] = (version, doc)
        return {i: StoredDocument(i, v, decode_json(doc)) for i, (v, doc) in found.items()}

    def _table(self, resource: str, index: str | None) -> str:
        """The concrete index behind the read alias, or ``index`` if it exists."""
        with self._txn(write=False) as cat:
            if index is None:
                return cat.read_index(self.read_alias(resource))
            cat.resource_of(index)  # IndexMissing unless it exists
            return index

    def count(
        self, resource: str, cell_uuid: str | None = None, *, index: str | None = None
    ) -> int:
        with self._txn(write=False) as cat:
            if index is None:
                index = cat.read_index(self.read_alias(resource))
            else:
                cat.resource_of(index)
            sql = f"SELECT count(*) FROM {quote(index)}"
            if cell_uuid is None:
                row = cat.conn.execute(sql).fetchone()
            else:
                row = cat.conn.execute(f"{sql} WHERE cell_uuid = ?", (cell_uuid,)).fetchone()
        return int(row[0])

    def iter_versions(
        self,
        resource: str,
        cell_uuid: str | None = None,
        batch_size: int = 5000,
        *,
        index: str | None = None,
    ) -> Iterator[tuple[str, int]]:
        yield from self._scans.versions(self._table(resource, index), cell_uuid, batch_size)

    def iter_tombstones(self, resource: str, deleted_before: datetime) -> Iterator[str]:
        _schema(resource)
        table = self._table(resource, None)
        if deleted_before.tzinfo is None:
            deleted_before = deleted_before.replace(tzinfo=UTC)
        before = sqlite_search.micros(deleted_before.astimezone(UTC))
        where, params = "deleted = 1 AND deleted_at < ?", (before,)
        for (doc_id,) in self._scans.rows(table, "id", where, params, 1000):
            yield doc_id

    # Search ----------------------------------------------------------------------------
    def search(self, resource: str, request: SearchRequest) -> list[StoredDocument]:
        schema = _schema(resource)
        with self._txn(write=False) as cat:
            index = cat.read_index(self.read_alias(resource))
            return sqlite_search.search(cat.conn, schema, index, request, self.search_timeout)

    # Metadata ------------------------------------------------------------------------
    def get_meta(self, key: str) -> dict[str, Any] | None:
        with self._txn(write=False) as cat:
            return cat.get_meta(key)

    def put_meta(self, key: str, value: dict[str, Any]) -> None:
        with self._txn(write=True) as cat:
            cat.put_meta(key, value)

    def swap_meta(self, key: str, expected: dict[str, Any] | None, value: dict[str, Any]) -> bool:
        # Read and write in one BEGIN IMMEDIATE transaction: no other writer in between.
        with self._txn(write=True) as cat:
            if cat.get_meta(key) != expected:
                return False
            cat.put_meta(key, value)
        return True


def _schema(resource: str) -> Schema:
    try:
        return SCHEMAS[resource]
    except KeyError:
        raise EngineError(f"unknown resource {resource!r}") from None
