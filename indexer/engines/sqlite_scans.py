"""The embedded index's long reads: every document's ``(id, version)`` (of one cell, or
all) and the tombstones past a date, in ascending id order.

Each is keyset-paged: one short statement per page, so no snapshot is held between
pages and a long scan never stalls the WAL checkpoint. A cell's documents sit in its
index in insertion order, not by id (``sqlite_schema`` says why: it is what a live write
pays for), so each page of a cell is sorted out of the cell's whole range in that index.
The pages grow with the cell, up to ``CELL_PAGE_MAX`` rows held at once: a cell is read
``CELL_SCAN_PASSES`` times up to 8 x ``CELL_PAGE_MAX`` documents, once a page beyond.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from cellsight.indexer.engines.sqlite_connections import Connections, translate
from cellsight.indexer.engines.sqlite_schema import cell_scan_index, quote

# Reads of a cell's range in its index per scan of the cell (the last, short page ends it).
CELL_SCAN_PASSES = 8
CELL_PAGE_MAX = 100_000  # rows of a page (about 10 MB of Python tuples)


class Scans:
    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    def versions(
        self, index: str, cell_uuid: str | None, batch_size: int
    ) -> Iterator[tuple[str, int]]:
        if cell_uuid is None:
            yield from self.rows(index, "id, version", "", (), batch_size)
            return
        scan_index = cell_scan_index(index)
        with self._connections.transaction(write=False) as cat:
            cat.resource_of(index)  # dropped meanwhile: IndexMissing
            indexed = cat.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (scan_index,)
            ).fetchone()
            (documents,) = cat.conn.execute(
                f"SELECT count(*) FROM {quote(index)} WHERE cell_uuid = ?", (cell_uuid,)
            ).fetchone()
        yield from self.rows(
            index,
            "id, version",
            "cell_uuid = ?",
            (cell_uuid,),
            max(batch_size, min(documents // CELL_SCAN_PASSES + 1, CELL_PAGE_MAX)),
            # An index of an earlier layout, not written since the upgrade, has none.
            indexed_by=scan_index if indexed else None,
        )

    def rows(
        self,
        index: str,
        columns: str,
        where: str,
        params: tuple[Any, ...],
        batch_size: int,
        *,
        indexed_by: str | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """Rows of ``index`` matching ``where`` in ascending id order (``columns`` start
        with ``id``), through ``indexed_by`` if given."""
        batch_size = max(1, batch_size)
        condition = f"{where} AND id > ?" if where else "id > ?"
        source = quote(index) + (f" INDEXED BY {quote(indexed_by)}" if indexed_by else "")
        sql = f"SELECT {columns} FROM {source} WHERE {condition} ORDER BY id LIMIT ?"
        last = ""
        while True:
            try:
                batch = self._connections.get().execute(sql, (*params, last, batch_size))
                page = batch.fetchall()
            except sqlite3.Error as exc:
                with self._connections.transaction(write=False) as cat:
                    cat.resource_of(index)  # dropped under us: IndexMissing
                raise translate(exc, self._connections.path) from exc
            yield from page
            if len(page) < batch_size:
                return
            last = page[-1][0]
