"""The embedded engine's versioned write path: rows prepared outside the transaction,
written inside it (one ``write_prepared`` call per transaction).

Versions are compared in Python against the stored ones, read inside the caller's
``BEGIN IMMEDIATE`` transaction, so they cannot change underneath; the upsert's
``WHERE excluded.version > version`` guard states the same rule in SQL. Only each id's
final winner is written: the table, its JSON and its multi-valued side rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple

from cellsight.indexer.engines.base import WriteOp, WriteResult, WriteStatus
from cellsight.indexer.engines.sqlite_catalog import Catalog
from cellsight.indexer.engines.sqlite_rows import InvalidDocument, Prepared, RowBuilder
from cellsight.indexer.engines.sqlite_schema import SCHEMAS, Schema, doc_table, quote, side_table

OK = WriteResult(WriteStatus.OK)
STALE = WriteResult(WriteStatus.STALE)


def rejected(reason: str) -> WriteResult:
    return WriteResult(WriteStatus.REJECTED, reason)


class Writer:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._builders = {resource: RowBuilder(schema) for resource, schema in SCHEMAS.items()}
        self._statements: dict[str, _Statements] = {}
        # (connection, index) pairs whose columns are known complete.
        self._complete: set[tuple[int, str]] = set()

    def prepare(
        self,
        schema: Schema,
        items: Sequence[tuple[int, WriteOp]],
        results: list[WriteResult | None],
    ) -> list[tuple[int, Prepared]]:
        """Rows of the valid ops (the CPU-bound half: no database, no lock needed);
        the others get their REJECTED result."""
        builder = self._builders[schema.resource]
        prepared: list[tuple[int, Prepared]] = []
        for i, op in items:
            try:
                prepared.append((i, builder.prepare(op)))
            except InvalidDocument as exc:
                results[i] = rejected(str(exc))
        return prepared

    def write_prepared(
        self,
        conn: sqlite3.Connection,
        schema: Schema,
        targets: Sequence[str],
        prepared: list[tuple[int, Prepared]],
        results: list[WriteResult | None],
    ) -> None:
        """Inside the caller's write transaction."""
        for index in targets:
            if (id(conn), index) not in self._complete:
                # The index may predate fields added since (once per connection).
                Catalog(conn, self.prefix).add_missing_columns(schema, index)
                self._complete.add((id(conn), index))
        conn.execute("SAVEPOINT bulk")
        try:
            took = self._upsert(conn, schema, targets, prepared)
        except UnicodeEncodeError:
            # Rare: a lone surrogate in a string. Find the culprits, write the rest.
            conn.execute("ROLLBACK TO bulk")
            good = []
            for i, p in prepared:
                if p.bindable():
                    good.append((i, p))
                else:
                    results[i] = rejected("a string is not valid Unicode (lone surrogate)")
            prepared = good
            took = self._upsert(conn, schema, targets, prepared)
        conn.execute("RELEASE bulk")
        for i, _ in prepared:
            results[i] = OK if i in took else STALE

    def _upsert(
        self,
        conn: sqlite3.Connection,
        schema: Schema,
        targets: Sequence[str],
        prepared: Sequence[tuple[int, Prepared]],
    ) -> set[int]:
        """Positions that some target took (the others already held a newer version)."""
        took: set[int] = set()
        if not prepared:
            return took
        ids = json.dumps([p.op.id for _, p in prepared])
        for index in targets:
            table = quote(index)
            existing: dict[str, tuple[int, int]] = {
                doc_id: (version, rid)
                for doc_id, version, rid in conn.execute(
                    f"SELECT id, version, rid FROM {table} "
                    "WHERE id IN (SELECT value FROM json_each(?))",
                    (ids,),
                )
            }
            # In op order, as the engines with external versions do: a later duplicate
            # wins only with a greater version. Only each id's final winner is written.
            held = {doc_id: version for doc_id, (version, _) in existing.items()}
            winners: dict[str, tuple[int, Prepared]] = {}
            for i, p in prepared:
                current = held.get(p.op.id)
                if current is None or p.op.version > current:
                    held[p.op.id] = p.op.version
                    winners[p.op.id] = (i, p)
                    took.add(i)
            if not winners:
                continue
            next_rid = conn.execute(f"SELECT coalesce(max(rid), 0) FROM {table}").fetchone()[0]
            # New ids are plain inserts (no conflict resolution to run); replaced ones keep
            # their rid, so the doc and side rows stay keyed alike.
            new_rows: list[tuple[Any, ...]] = []
            new_docs: list[tuple[int, str]] = []
            rows: list[tuple[Any, ...]] = []
            docs: list[tuple[int, str]] = []
            old_rids: list[tuple[int]] = []
            side: list[tuple[int, str, str]] = []
            for doc_id, (_, p) in winners.items():
                found = existing.get(doc_id)
                if found is not None:
                    rid = found[1]
                    old_rids.append((rid,))
                    rows.append((rid, *p.row))
                    docs.append((rid, p.doc))
                else:
                    next_rid += 1
                    rid = next_rid
                    new_rows.append((rid, *p.row))
                    new_docs.append((rid, p.doc))
                if p.side:
                    side.extend([(rid, field, value) for field, value in p.side])
            sql = self._sql(schema, index)
            if new_rows:
                conn.executemany(sql.insert, new_rows)
                conn.executemany(sql.insert_doc, new_docs)
            if rows:
                conn.executemany(sql.upsert, rows)
                conn.executemany(sql.replace_doc, docs)
                conn.executemany(sql.delete_side, old_rids)
            if side:
                conn.executemany(sql.insert_side, side)
        return took

    def _sql(self, schema: Schema, index: str) -> _Statements:
        sql = self._statements.get(index)
        if sql is None:
            sql = self._statements[index] = _Statements.of(schema, index)
        return sql


class _Statements(NamedTuple):
    """The write statements of one index, built once (sqlite3 caches them prepared)."""

    insert: str
    upsert: str
    insert_doc: str
    replace_doc: str
    delete_side: str
    insert_side: str

    @classmethod
    def of(cls, schema: Schema, index: str) -> _Statements:
        upsert = schema.upsert_sql(index)
        many = side_table(index)
        return cls(
            insert=upsert.partition(" ON CONFLICT")[0],
            upsert=upsert,
            insert_doc=f"INSERT INTO {doc_table(index)} VALUES (?, ?)",
            replace_doc=f"INSERT OR REPLACE INTO {doc_table(index)} VALUES (?, ?)",
            delete_side=f"DELETE FROM {many} WHERE rid = ?",
            # OR IGNORE: a list may repeat a value (tags ["a", "a"]); the key is the set
            insert_side=f"INSERT OR IGNORE INTO {many} VALUES (?, ?, ?)",
        )
