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
from cellsight.indexer.engines.sqlite_rows import Prepared, RowBuilder
from cellsight.indexer.engines.sqlite_schema import SCHEMAS
from cellsight.indexer.engines.sqlite_write import Statements


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


class FloorWriter:
    """The engine's own connection and pragmas, and only the statements its writer runs
    for new documents: one transaction per batch, rids continuing from batch to batch,
    no version reads, no checks. With ``checkpoint_thread`` each commit hands the
    engine's checkpoint thread its checkpoint, as the engine's transactions do (without
    that the WAL grew past 800 MB in 100,000 documents, which the engine's never does);
    without it the committing connection checkpoints as SQLite does by default (every
    1,000 WAL pages), which is what the engine did before ``sqlite_checkpoint``."""

    def __init__(self, path: Path, *, checkpoint_thread: bool = True, bulk_load: bool = False):
        self.engine = EmbeddedEngine(path, prefix="floor")
        if bulk_load:
            self.index = "floor-instance-load"
            self.engine.create_index("instance", self.index, bulk_load=True)
        else:
            self.engine.ensure_ready("instance")
            (info,) = self.engine.indexes("instance")
            self.index = info.name
        self.checkpoint_thread = checkpoint_thread
        if not checkpoint_thread:
            self.engine._connections.checkpointer.close()
            self.engine._conn().execute("PRAGMA wal_autocheckpoint=1000")
        schema = SCHEMAS["instance"]
        self.builder = RowBuilder(schema)
        self.conn = self.engine._conn()  # the engine's own connection: same pragmas
        self.sql = Statements.of(schema, self.index)  # the writer's own statements
        self.rid = 0

    def prepare(self, ops: list[WriteOp]) -> list[Prepared]:
        """The rows (before the clock)."""
        return [self.builder.prepare(op) for op in ops]

    def write(self, prepared: list[Prepared], batch: int | None = None) -> int:
        """Returns how many rows it wrote (all)."""
        conn, batch = self.conn, batch or len(prepared) or 1
        for k in range(0, len(prepared), batch):
            chunk, first = prepared[k : k + batch], self.rid + 1
            self.rid += len(chunk)
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(self.sql.insert, [(first + n, *p.row) for n, p in enumerate(chunk)])
            conn.executemany(self.sql.insert_doc, [(first + n, p.doc) for n, p in enumerate(chunk)])
            conn.executemany(
                self.sql.insert_side,
                [(first + n, f, v) for n, p in enumerate(chunk) for f, v in p.side],
            )
            conn.execute("COMMIT")
            if self.checkpoint_thread:
                self.engine._connections.checkpointer.committed()
        return len(prepared)

    def finish(self) -> None:
        self.engine.finish_bulk_load(self.index)

    def close(self) -> None:
        self.engine.close()


def sqlite_floor(
    path: Path,
    ops: list[WriteOp],
    batch: int,
    *,
    checkpoint_thread: bool = True,
    bulk_load: bool = False,
) -> dict[str, Any]:
    """The floor of a whole load (``FloorWriter``). With ``bulk_load`` the rows go in id
    order, as a sync reads its cells, and the figures add ``finish_seconds`` and
    ``docs_per_s_with_finish``, as a sync's."""
    floor = FloorWriter(path, checkpoint_thread=checkpoint_thread, bulk_load=bulk_load)
    if bulk_load:
        ops = sorted(ops, key=lambda op: op.id)
    prepared = floor.prepare(ops)
    with Clock() as clock:
        floor.write(prepared, batch)
    figures: dict[str, Any] = clock.figures(len(ops))
    if bulk_load:
        with Clock() as finish:
            floor.finish()
        figures["finish_seconds"] = round(finish.wall, 3)
        figures["docs_per_s_with_finish"] = round(len(ops) / (clock.wall + finish.wall))
    floor.close()
    return figures
