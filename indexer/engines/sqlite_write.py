"""The embedded engine's versioned write path (one call per transaction).

Versions are compared in Python against the stored ones, read inside the caller's
``BEGIN IMMEDIATE`` transaction, so they cannot change underneath; the upsert's
``WHERE excluded.version > version`` guard states the same rule in SQL. Only each id's
final winner is written: the table, its JSON and its multi-valued side rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from indexer.engines.base import WriteOp, WriteResult, WriteStatus
from indexer.engines.sqlite_catalog import Catalog
from indexer.engines.sqlite_rows import InvalidDocument, Prepared, RowBuilder
from indexer.engines.sqlite_schema import SCHEMAS, Schema, doc_table, quote, side_table

OK = WriteResult(WriteStatus.OK)
STALE = WriteResult(WriteStatus.STALE)


def rejected(reason: str) -> WriteResult:
    return WriteResult(WriteStatus.REJECTED, reason)


class Writer:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._builders = {resource: RowBuilder(schema) for resource, schema in SCHEMAS.items()}
        self._upserts: dict[str, str] = {}

    def write(
        self,
        conn: sqlite3.Connection,
        schema: Schema,
        targets: Sequence[str],
        items: Sequence[tuple[int, WriteOp]],
        results: list[WriteResult | None],
    ) -> None:
        builder = self._builders[schema.resource]
        prepared: list[tuple[int, Prepared]] = []
        for i, op in items:
            try:
                prepared.append((i, builder.prepare(op)))
            except InvalidDocument as exc:
                results[i] = rejected(str(exc))
        for index in targets:
            # Cheap (one PRAGMA), and the index may predate fields added since.
            Catalog(conn, self.prefix).add_missing_columns(schema, index)
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
            rows: list[tuple[Any, ...]] = []
            docs: list[tuple[int, str]] = []
            old_rids: list[tuple[int]] = []
            side: list[tuple[int, str, str]] = []
            for doc_id, (_, p) in winners.items():
                if doc_id in existing:
                    rid = existing[doc_id][1]
                    old_rids.append((rid,))
                else:
                    next_rid += 1
                    rid = next_rid
                rows.append((rid, *p.row))
                docs.append((rid, p.doc))
                side.extend((rid, field, value) for field, value in p.side)
            conn.executemany(self._upsert_sql(schema, index), rows)
            conn.executemany(f"INSERT OR REPLACE INTO {doc_table(index)} VALUES (?, ?)", docs)
            many = side_table(index)
            if old_rids:
                conn.executemany(f"DELETE FROM {many} WHERE rid = ?", old_rids)
            if side:
                conn.executemany(f"INSERT OR IGNORE INTO {many} VALUES (?, ?, ?)", side)
        return took

    def _upsert_sql(self, schema: Schema, index: str) -> str:
        sql = self._upserts.get(index)
        if sql is None:
            sql = self._upserts[index] = schema.upsert_sql(index)
        return sql
