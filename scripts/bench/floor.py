"""The embedded engine's floor: the same rows through the same SQL with nothing else.

Rows are prepared (``RowBuilder``) before the clock; then only the statements the
engine's writer runs for new documents, one transaction per batch: no version reads,
no checks. What the engine cannot beat on this machine, live (into an index with its
secondary indexes) or as a bulk sync loads (into a bulk-loading index, in id order,
then the index build of ``finish_bulk_load``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_rows import RowBuilder
from cellsight.indexer.engines.sqlite_schema import SCHEMAS, doc_table, side_table


class Clock:
    """Wall and CPU (this thread) time of a block."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.thread_time() - self.cpu

    def figures(self, docs: int) -> dict[str, float]:
        return {
            "docs_per_s": round(docs / self.wall),
            "cpu_us_per_doc": round(self.cpu / docs * 1e6, 1),
            "seconds": round(self.wall, 3),
        }


def sqlite_floor(
    path: Path,
    ops: list[WriteOp],
    batch: int,
    *,
    checkpoint_thread: bool = True,
    bulk_load: bool = False,
) -> dict[str, Any]:
    """With ``checkpoint_thread`` each commit hands the engine's checkpoint thread its
    checkpoint, as the engine's transactions do (without that the WAL grew past 800 MB
    in 100,000 documents, which the engine's never does); without it the committing
    connection checkpoints as SQLite does by default (every 1,000 WAL pages), which is
    what the engine did before ``sqlite_checkpoint``. With ``bulk_load`` the figures
    add ``finish_seconds`` and ``docs_per_s_with_finish``, as a sync's."""
    engine = EmbeddedEngine(path, prefix="floor")
    schema = SCHEMAS["instance"]
    if bulk_load:
        index = "floor-instance-load"
        engine.create_index("instance", index, bulk_load=True)
        ops = sorted(ops, key=lambda op: op.id)  # as a sync reads its cells
    else:
        engine.ensure_ready("instance")
        (info,) = engine.indexes("instance")
        index = info.name
    if not checkpoint_thread:
        engine._connections.checkpointer.close()
        engine._conn().execute("PRAGMA wal_autocheckpoint=1000")
    builder = RowBuilder(schema)
    prepared = [builder.prepare(op) for op in ops]
    conn = engine._conn()  # the engine's own connection: same pragmas
    insert = schema.insert_sql(index)
    docs_sql = f"INSERT INTO {doc_table(index)} VALUES (?, ?)"
    side_sql = f"INSERT INTO {side_table(index)} VALUES (?, ?, ?)"
    with Clock() as clock:
        for k in range(0, len(prepared), batch):
            chunk = prepared[k : k + batch]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(insert, [(k + n + 1, *p.row) for n, p in enumerate(chunk)])
            conn.executemany(docs_sql, [(k + n + 1, p.doc) for n, p in enumerate(chunk)])
            conn.executemany(
                side_sql,
                [(k + n + 1, f, v) for n, p in enumerate(chunk) for f, v in p.side],
            )
            conn.execute("COMMIT")
            if checkpoint_thread:
                engine._connections.checkpointer.committed()
    figures: dict[str, Any] = clock.figures(len(ops))
    if bulk_load:
        with Clock() as finish:
            engine.finish_bulk_load(index)
        figures["finish_seconds"] = round(finish.wall, 3)
        figures["docs_per_s_with_finish"] = round(len(ops) / (clock.wall + finish.wall))
    engine.close()
    return figures
