"""The embedded index's catalog: concrete indexes, aliases and metadata, in three tables.

``_cs_indexes`` registers each concrete index (its resource, the prefix of the engine
that made it, creation time, and whether it is still bulk loading); ``_cs_aliases`` maps
an alias name to its indexes; ``_cs_meta`` holds the small JSON values the indexer and
bulk sync keep (synced marker, purge floor), scoped by prefix as the HTTP engines scope
them by their ``<prefix>-meta`` index. Every method runs inside the caller's transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from cellsight.indexer.engines.base import EngineError, IndexInfo, IndexMissing
from cellsight.indexer.engines.sqlite_schema import (
    AFFINITY,
    Schema,
    check_index_name,
    doc_table,
    micros_to_date,
    quote,
    side_table,
)

log = logging.getLogger(__name__)

CATALOG_SQL = (
    "CREATE TABLE IF NOT EXISTS _cs_indexes (name TEXT PRIMARY KEY, prefix TEXT NOT NULL, "
    "resource TEXT NOT NULL, created_us INTEGER NOT NULL, bulk_load INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS _cs_aliases (alias TEXT NOT NULL, index_name TEXT NOT NULL, "
    "role TEXT NOT NULL CHECK (role IN ('read', 'write')), PRIMARY KEY (alias, index_name))",
    "CREATE TABLE IF NOT EXISTS _cs_meta (prefix TEXT NOT NULL, key TEXT NOT NULL, "
    "value TEXT NOT NULL, updated_us INTEGER NOT NULL, PRIMARY KEY (prefix, key))",
)


@contextmanager
def temp_on_disk(conn: sqlite3.Connection) -> Iterator[None]:
    """Temporary storage in files for one big operation. Building an index sorts every
    row and dropping one journals every page it frees: in memory, a million documents
    cost hundreds of MB (bulk sync's peak RSS); on disk, nothing."""
    (before,) = conn.execute("PRAGMA temp_store").fetchone()
    try:
        conn.execute("PRAGMA temp_store=FILE")
    except sqlite3.OperationalError:
        # Inside a transaction, once this connection has opened its temporary database,
        # SQLite refuses the change: the operation then runs with the setting it has.
        yield
        return
    try:
        yield
    finally:
        # Refused for the same reason if the operation opened it: the connection then
        # keeps spilling to files, which only costs speed.
        with contextlib.suppress(sqlite3.OperationalError):
            conn.execute(f"PRAGMA temp_store={int(before)}")


def _now_us() -> int:
    return (datetime.now(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // datetime.resolution


class Catalog:
    def __init__(self, conn: sqlite3.Connection, prefix: str) -> None:
        self.conn = conn
        self.prefix = prefix

    def ensure(self) -> None:
        """``create`` when a catalog table is missing: a read first, so that a connection
        opened while a writer holds the lock (a sync's load) need not wait for it."""
        tables = ("_cs_indexes", "_cs_aliases", "_cs_meta")
        found = self.conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)",
            tables,
        ).fetchone()[0]
        if found < len(tables):
            self.create()

    def create(self) -> None:
        """The catalog tables, in their own transaction (at connection time)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            for sql in CATALOG_SQL:
                self.conn.execute(sql)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # Aliases --------------------------------------------------------------------
    def targets(self, alias: str) -> list[str]:
        rows = self.conn.execute(
            "SELECT index_name FROM _cs_aliases WHERE alias = ? ORDER BY index_name", (alias,)
        )
        return [name for (name,) in rows]

    def read_index(self, alias: str) -> str:
        targets = self.targets(alias)
        if not targets:
            raise IndexMissing(f"alias {alias} does not exist")
        if len(targets) > 1:
            raise EngineError(f"alias {alias} points at {len(targets)} indexes; reads need one")
        return targets[0]

    def newest(self, alias: str) -> str:
        row = self.conn.execute(
            "SELECT i.name FROM _cs_aliases a JOIN _cs_indexes i ON i.name = a.index_name "
            "WHERE a.alias = ? ORDER BY i.created_us DESC, i.name DESC LIMIT 1",
            (alias,),
        ).fetchone()
        if row is None:
            raise IndexMissing(f"alias {alias} does not exist")
        return str(row[0])

    def point(self, alias: str, indexes: Sequence[str], role: str) -> None:
        self.conn.execute("DELETE FROM _cs_aliases WHERE alias = ?", (alias,))
        self.conn.executemany(
            "INSERT INTO _cs_aliases (alias, index_name, role) VALUES (?, ?, ?)",
            [(alias, name, role) for name in indexes],
        )

    # Concrete indexes -------------------------------------------------------------
    def resource_of(self, name: str) -> str:
        row = self.conn.execute(
            "SELECT resource FROM _cs_indexes WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise IndexMissing(f"index {name} does not exist")
        return str(row[0])

    def create_index(self, schema: Schema, name: str, *, bulk_load: bool) -> None:
        try:
            check_index_name(name)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        taken = self.conn.execute(
            "SELECT 1 FROM _cs_indexes WHERE name = ? UNION ALL "
            "SELECT 1 FROM _cs_aliases WHERE alias = ? UNION ALL "
            "SELECT 1 FROM sqlite_master WHERE name = ?",
            (name, name, name),
        ).fetchone()
        if taken:
            raise EngineError(f"index {name} already exists")
        for sql in schema.create_sql(name):
            self.conn.execute(sql)
        if not bulk_load:
            for sql in schema.index_sql(name):
                self.conn.execute(sql)
        self.conn.execute(
            "INSERT INTO _cs_indexes (name, prefix, resource, created_us, bulk_load) "
            "VALUES (?, ?, ?, ?, ?)",
            (name, self.prefix, schema.resource, _now_us(), int(bulk_load)),
        )

    def finish_bulk_load(self, schema: Schema, name: str) -> None:
        # Building each index once over the loaded table is far cheaper than keeping it
        # up to date row by row; ANALYZE lets the planner pick among them. A full one (~1 s
        # per million documents): a sampled one (``analysis_limit``) reads only the first
        # rows of each index, so it saw one state in the first thousand and told the
        # planner a state matches ~1000 rows, where ``active`` matches three quarters.
        for sql in schema.index_sql(name):
            self.conn.execute(sql)
        self._analyze(name)
        self.conn.execute("UPDATE _cs_indexes SET bulk_load = 0 WHERE name = ?", (name,))

    def _analyze(self, target: str) -> None:
        """Full statistics of a table or one index (see ``finish_bulk_load``)."""
        self.conn.execute("PRAGMA analysis_limit = 0")
        self.conn.execute(f"ANALYZE {quote(target)}")

    def drop_index(self, name: str) -> None:
        """Like deleting an Elasticsearch index: its aliases go too; a missing one is fine."""
        if not self.conn.execute("SELECT 1 FROM _cs_indexes WHERE name = ?", (name,)).fetchone():
            return
        for table in (quote(name), doc_table(name), side_table(name)):
            self.conn.execute(f"DROP TABLE IF EXISTS {table}")
        self.conn.execute("DELETE FROM _cs_aliases WHERE index_name = ?", (name,))
        self.conn.execute("DELETE FROM _cs_indexes WHERE name = ?", (name,))

    def add_missing_columns(self, schema: Schema, name: str) -> None:
        """Columns for fields added to the registry since the index was made. They start
        empty (NULL) for the documents already stored, until a full sync rebuilds it."""
        have = {row[1] for row in self.conn.execute(f"PRAGMA table_info({quote(name)})")}
        for f in schema.columns:
            if f.name not in have:
                self.conn.execute(
                    f"ALTER TABLE {quote(name)} ADD COLUMN {quote(f.name)} {AFFINITY[f.kind]}"
                )
                log.warning("index %s: added column %s; run a full sync to fill it", name, f.name)

    def update_indexes(self, schema: Schema, name: str) -> None:
        """Give an index made by an earlier layout the current secondary indexes: the
        declared ones it lacks are built, the ones no longer declared dropped (each costs
        every live write). A bulk-loading index gets them at ``finish_bulk_load``."""
        row = self.conn.execute(
            "SELECT bulk_load FROM _cs_indexes WHERE name = ?", (name,)
        ).fetchone()
        if row is None or row[0]:
            return
        declared = schema.secondary_indexes(name)
        have = {
            index
            for (index,) in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name IN (?, ?) "
                "AND sql IS NOT NULL",  # not the automatic ones of UNIQUE and PRIMARY KEY
                (name, f"{name}#many"),
            )
        }
        obsolete = sorted(i for i in have - declared.keys() if i.startswith(f"{name}#"))
        missing = sorted(declared.keys() - have)
        if not (obsolete or missing):
            return
        # An analyzed index keeps statistics for every one of its indexes: the planner and
        # the search's walk (``sqlite_search``) rely on them.
        analyzed = (
            self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone()
            and self.conn.execute(
                "SELECT 1 FROM sqlite_stat1 WHERE tbl = ? LIMIT 1", (name,)
            ).fetchone()
        )
        with temp_on_disk(self.conn):  # a sort past the page cache spills to files
            for index in obsolete:
                self.conn.execute(f"DROP INDEX {quote(index)}")
            for index in missing:
                self.conn.execute(declared[index])
                if analyzed:
                    self._analyze(index)
        log.warning(
            "index %s: secondary indexes brought to this version's layout (built %s; dropped %s)",
            name,
            ", ".join(missing) or "none",
            ", ".join(obsolete) or "none",
        )

    def infos(self, resource: str, read_alias: str, write_alias: str) -> list[IndexInfo]:
        rows = self.conn.execute(
            "SELECT name, created_us, bulk_load FROM _cs_indexes "
            "WHERE prefix = ? AND resource = ? ORDER BY name",
            (self.prefix, resource),
        ).fetchall()
        readers, writers = set(self.targets(read_alias)), set(self.targets(write_alias))
        out = []
        for name, created_us, bulk_load in rows:
            (docs,) = self.conn.execute(f"SELECT count(*) FROM {quote(name)}").fetchone()
            meta = {
                "prefix": self.prefix,
                "resource": resource,
                "created_at": micros_to_date(created_us),
                "bulk_load": bool(bulk_load),
            }
            out.append(IndexInfo(name, resource, docs, name in readers, name in writers, meta))
        return out

    # Metadata ---------------------------------------------------------------------
    def get_meta(self, key: str) -> dict[str, Any] | None:
        row = self.conn.execute(
            "SELECT value FROM _cs_meta WHERE prefix = ? AND key = ?", (self.prefix, key)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def put_meta(self, key: str, value: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO _cs_meta (prefix, key, value, updated_us) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (prefix, key) DO UPDATE SET value = excluded.value, "
            "updated_us = excluded.updated_us",
            (self.prefix, key, json.dumps(value, allow_nan=False), _now_us()),
        )
