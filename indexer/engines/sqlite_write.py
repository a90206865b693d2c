"""The embedded engine's versioned write path: rows prepared outside the transaction,
written inside it (one ``write_prepared`` call per transaction).

Versions are compared in Python against the stored ones, read inside the caller's
``BEGIN IMMEDIATE`` transaction, so they cannot change underneath; the update's
``WHERE version < ?`` guard states the same rule in SQL. Only each id's final winner is
written: the table, its JSON and its multi-valued side rows. A replaced document's
row is compared with the stored one and only the columns that changed are set, and its
multi-valued rows are rewritten only if they changed: SQLite rewrites the index entries
of every column an UPDATE sets, so an instance's state change would otherwise dirty a
page in each of the table's nine secondary indexes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from itertools import compress, count
from operator import ne
from typing import Any, NamedTuple

from cellsight.indexer.engines.base import WriteOp, WriteResult, WriteStatus, tags_version_of
from cellsight.indexer.engines.sqlite_catalog import Catalog
from cellsight.indexer.engines.sqlite_rows import InvalidDocument, Prepared, RowBuilder, decode_json
from cellsight.indexer.engines.sqlite_schema import SCHEMAS, Schema, doc_table, quote, side_table

# Distinct sets of changed columns whose UPDATE is kept (sqlite3 caches the statements).
MAX_UPDATE_SHAPES = 256
OK = WriteResult(WriteStatus.OK)
STALE = WriteResult(WriteStatus.STALE)


def rejected(reason: str) -> WriteResult:
    return WriteResult(WriteStatus.REJECTED, reason)


class Writer:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._builders = {resource: RowBuilder(schema) for resource, schema in SCHEMAS.items()}
        self._statements: dict[str, Statements] = {}
        self._updates: dict[tuple[str, tuple[int, ...]], str] = {}
        # (connection, index) -> the schema version at which its columns and secondary
        # indexes were found current. Any schema change moves the version, a rolled-back
        # one included (the update made inside a transaction that failed), so a stale
        # entry never vouches for an index that was not brought up to date.
        self._current: dict[tuple[int, str], int] = {}

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
        (version,) = conn.execute("PRAGMA schema_version").fetchone()
        stale = [i for i in targets if self._current.get((id(conn), i)) != version]
        if stale:
            # The index may predate fields or a layout of its secondary indexes added since.
            catalog = Catalog(conn, self.prefix)
            for index in stale:
                catalog.add_missing_columns(schema, index)
                catalog.update_indexes(schema, index)
            (version,) = conn.execute("PRAGMA schema_version").fetchone()
            for index in stale:
                self._current[(id(conn), index)] = version
        conn.execute("SAVEPOINT bulk")
        try:
            took, stored_tags = self._upsert(conn, schema, targets, prepared)
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
            took, stored_tags = self._upsert(conn, schema, targets, prepared)
        conn.execute("RELEASE bulk")
        for i, _ in prepared:
            if i in took:
                results[i] = OK
            elif i in stored_tags:
                results[i] = WriteResult(WriteStatus.STALE, tags_version=stored_tags[i])
            else:
                results[i] = STALE

    def _upsert(
        self,
        conn: sqlite3.Connection,
        schema: Schema,
        targets: Sequence[str],
        prepared: Sequence[tuple[int, Prepared]],
    ) -> tuple[set[int], dict[int, int]]:
        """Positions that some target took (the others already held a newer version),
        and the stored tags version a stale one met (the oldest over the targets)."""
        took: set[int] = set()
        stored_tags: dict[int, int] = {}
        if not prepared:
            return took, stored_tags
        ids = json.dumps([p.op.id for _, p in prepared])
        for index in targets:
            table = quote(index)
            sql = self._sql(schema, index)
            existing: dict[str, tuple[int, int]] = {}
            # (version, tags version): in op order, as the engines with external versions
            # do, a later duplicate wins only with a greater version. Only each id's final
            # winner is written.
            held: dict[str, tuple[int, int]] = {}
            for doc_id, version, rid, tags in conn.execute(sql.select_versions, (ids,)):
                existing[doc_id] = (version, rid)
                held[doc_id] = (version, tags)
            winners: dict[str, tuple[int, Prepared]] = {}
            for i, p in prepared:
                op = p.op
                current = held.get(op.id)
                if current is None:
                    if op.same_version:
                        continue  # a correction of a document that is gone: nothing to do
                elif op.version > current[0]:
                    if tags_version_of(op.document, op.version) < current[1]:
                        p = self._newer_tags(conn, sql, schema, p, current[1], winners, existing)
                        op = p.op  # what ``held`` records below: the tags it now has
                elif not (
                    # A same-version write corrects the tags; it takes the stored document
                    # only while that holds older tags (another writer may have been first).
                    op.same_version
                    and op.version == current[0]
                    and current[1] < tags_version_of(op.document, op.version)
                ):
                    stored_tags[i] = min(stored_tags.get(i, current[1]), current[1])
                    continue
                held[op.id] = (op.version, tags_version_of(op.document, op.version))
                winners[op.id] = (i, p)
                took.add(i)
            if not winners:
                continue
            next_rid = conn.execute(f"SELECT coalesce(max(rid), 0) FROM {table}").fetchone()[0]
            # New ids are plain inserts (no conflict resolution to run); replaced ones keep
            # their rid, so the doc and side rows stay keyed alike.
            new_rows: list[tuple[Any, ...]] = []
            new_docs: list[tuple[int, str]] = []
            docs: list[tuple[int, str]] = []
            replaced: dict[int, Prepared] = {}
            side: list[tuple[int, str, str]] = []
            for doc_id, (_, p) in winners.items():
                found = existing.get(doc_id)
                if found is not None:
                    replaced[found[1]] = p
                    docs.append((found[1], p.doc))
                    continue
                next_rid += 1
                new_rows.append((next_rid, *p.row))
                new_docs.append((next_rid, p.doc))
                if p.side:
                    side.extend([(next_rid, field, value) for field, value in p.side])
            if new_rows:
                conn.executemany(sql.insert, new_rows)
                conn.executemany(sql.insert_doc, new_docs)
            if replaced:
                for changed, params in self._row_changes(conn, sql, replaced).items():
                    if changed:  # nothing changed: a same-version rewrite of equal columns
                        conn.executemany(self._update_sql(schema, index, changed), params)
                conn.executemany(sql.replace_doc, docs)
                side.extend(self._side_changes(conn, sql, replaced))
            if side:
                conn.executemany(sql.insert_side, side)
        return took, stored_tags

    def _newer_tags(
        self,
        conn: sqlite3.Connection,
        sql: Statements,
        schema: Schema,
        p: Prepared,
        tags_version: int,
        winners: dict[str, tuple[int, Prepared]],
        existing: dict[str, tuple[int, int]],
    ) -> Prepared:
        """``p`` with the tags of the document it replaces, which are newer than those
        it was given: a tag-less event's tags were read before another writer (``--workers
        N``) stored a newer event that carried tags, and are written after it (a probe:
        7 in 150 instances kept an older update's tags). Decided here, under the write
        lock, where nothing can come between the read and the write. ``tags_version``:
        the replaced document's, as ``_upsert`` holds it."""
        earlier = winners.get(p.op.id)
        if earlier is not None:  # a winner of this batch
            stored = earlier[1].op.document
        else:
            (raw,) = conn.execute(sql.select_doc, (existing[p.op.id][1],)).fetchone()
            stored = decode_json(raw)
        tags = stored.get("tags", [])
        document = {**p.op.document, "tags": tags, "tags_version": tags_version}
        return self._builders[schema.resource].prepare(p.op._replace(document=document))

    def _row_changes(
        self, conn: sqlite3.Connection, sql: Statements, replaced: dict[int, Prepared]
    ) -> dict[tuple[int, ...], list[tuple[Any, ...]]]:
        """The replaced rows' UPDATE parameters, grouped by the columns that changed.
        SQLite rewrites the index entries of every column an UPDATE sets, even to the same
        value, and each dirties a page the commit writes to the WAL; an instance's update
        mostly changes its state and times. The version changes unless the write was a
        same-version one (``WriteOp.same_version``), the id never does. Stored rows are
        read only for the winners (a stale document, most of an hourly audit, costs its
        version read alone)."""
        updates: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}
        for rid, *stored in conn.execute(sql.select_rows, (json.dumps(list(replaced)),)):
            p = replaced[rid]
            row = p.row
            changed = tuple(compress(count(), map(ne, row, stored)))
            # The guard is ``version < ?``: a same-version write passes it with version + 1.
            guard = row[1] + 1 if p.op.same_version else row[1]
            updates.setdefault(changed, []).append((*[row[c] for c in changed], rid, guard))
        return updates

    def _side_changes(
        self, conn: sqlite3.Connection, sql: Statements, replaced: dict[int, Prepared]
    ) -> list[tuple[int, str, str]]:
        """The multi-valued rows to insert for replaced documents, after deleting the old
        ones of those whose values changed; unchanged ones (tags and addresses rarely
        change) are left alone, with their index entries."""
        stored: dict[int, set[tuple[str, str]]] = {rid: set() for rid in replaced}
        rids = json.dumps(list(replaced))
        for rid, field, value in conn.execute(sql.select_side, (rids,)):
            stored[rid].add((field, value))
        changed = [rid for rid, p in replaced.items() if set(p.side) != stored[rid]]
        conn.executemany(sql.delete_side, [(rid,) for rid in changed if stored[rid]])
        return [(rid, field, value) for rid in changed for field, value in replaced[rid].side]

    def _update_sql(self, schema: Schema, index: str, changed: tuple[int, ...]) -> str:
        key = (index, changed)
        sql = self._updates.get(key)
        if sql is None:
            if len(self._updates) >= MAX_UPDATE_SHAPES:
                self._updates.clear()
            sets = ", ".join(f"{quote(schema.row_names[c])} = ?" for c in changed)
            # The guard states the version rule in SQL too (decided above, under the lock).
            sql = self._updates[key] = (
                f"UPDATE {quote(index)} SET {sets} WHERE rid = ? AND version < ?"
            )
        return sql

    def _sql(self, schema: Schema, index: str) -> Statements:
        sql = self._statements.get(index)
        if sql is None:
            sql = self._statements[index] = Statements.of(schema, index)
        return sql


class Statements(NamedTuple):
    """The write statements of one index, built once (sqlite3 caches them prepared)."""

    select_versions: str
    select_rows: str  # whole, rid first, then as ``Prepared.row``
    select_side: str
    select_doc: str
    insert: str
    insert_doc: str
    replace_doc: str
    delete_side: str
    insert_side: str

    @classmethod
    def of(cls, schema: Schema, index: str) -> Statements:
        many = side_table(index)
        columns = ", ".join(quote(n) for n in schema.row_names)
        has_tags = "tags_version" in schema.row_names
        tags = 'coalesce("tags_version", version)' if has_tags else "version"
        return cls(
            # Documents without a tags version (nodes; instances written before it existed)
            # have tags as new as themselves.
            select_versions=f"SELECT id, version, rid, {tags} FROM {quote(index)} "
            "WHERE id IN (SELECT value FROM json_each(?))",
            select_rows=f"SELECT rid, {columns} FROM {quote(index)} "
            "WHERE rid IN (SELECT value FROM json_each(?))",
            select_side=f"SELECT rid, field, value FROM {many} "
            "WHERE rid IN (SELECT value FROM json_each(?))",
            select_doc=f"SELECT doc FROM {doc_table(index)} WHERE rid = ?",
            insert=schema.insert_sql(index),
            insert_doc=f"INSERT INTO {doc_table(index)} VALUES (?, ?)",
            replace_doc=f"INSERT OR REPLACE INTO {doc_table(index)} VALUES (?, ?)",
            delete_side=f"DELETE FROM {many} WHERE rid = ?",
            # OR IGNORE: a list may repeat a value (tags ["a", "a"]); the key is the set
            insert_side=f"INSERT OR IGNORE INTO {many} VALUES (?, ?, ?)",
        )
