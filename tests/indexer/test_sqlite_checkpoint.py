"""The embedded index's WAL checkpoints run on their own thread: the writing connection
only checkpoints past a large fallback threshold, readers are left as they are, the
WAL restarts from its beginning once it passes its limit (trimmed to it, not emptied),
and closing the engine stops the thread."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_checkpoint import WRITER_FALLBACK_PAGES, Checkpointer
from cellsight.indexer.planning import plan
from tests.support.indexing import wait_for
from tests.support.novagen import body, notification


def ops_of(seeds: range) -> list[WriteOp]:
    return [p.op for p in plan([body(notification("instance.update", seed=i)) for i in seeds])[1]]


def _autocheckpoint(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])


def test_writes_hand_checkpoints_to_the_thread(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    checkpointer = engine._connections.checkpointer
    checkpointer.interval = 3600.0  # so only a commit can ask for the checkpoints below
    engine.ensure_ready("instance")
    wait_for(lambda: checkpointer.checkpoints >= 1, 10, "the commits' checkpoint")
    before = checkpointer.checkpoints
    engine.bulk(ops_of(range(50)))
    assert _autocheckpoint(engine._conn()) == WRITER_FALLBACK_PAGES
    wait_for(lambda: checkpointer.checkpoints > before, 10, "a checkpoint after the bulk")
    engine.close()
    assert checkpointer._thread is None


def test_a_reading_connection_keeps_sqlites_own_setting(tmp_path: Path) -> None:
    writer = EmbeddedEngine(tmp_path / "index.db")
    writer.ensure_ready("instance")
    reader = EmbeddedEngine(tmp_path / "index.db")
    assert reader.count("instance") == 0
    assert _autocheckpoint(reader._conn()) == 1000  # SQLite's default
    assert reader._connections.checkpointer._thread is None
    reader.close()
    writer.close()


def test_a_wal_past_its_limit_restarts_in_place(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    engine._connections.checkpointer.close()  # this test checkpoints by hand
    engine.bulk(ops_of(range(50)))
    wal = tmp_path / "index.db-wal"
    full = wal.stat().st_size
    assert full > 0
    conn = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    patient = Checkpointer(tmp_path / "index.db", timeout=1.0)
    patient.checkpoint(conn)
    assert (patient.checkpoints, patient.restarts) == (1, 0)  # under the limit: passive
    engine.bulk(ops_of(range(50, 51)))
    # Past the limit, the log restarts: the next batch is written over the file's first
    # blocks (a file emptied by TRUNCATE would be one batch long).
    by_hand = Checkpointer(tmp_path / "index.db", timeout=1.0, restart_at=1)
    by_hand.checkpoint(conn)
    assert (by_hand.checkpoints, by_hand.restarts) == (1, 1)
    engine.bulk(ops_of(range(51, 52)))
    assert wal.stat().st_size == full
    assert engine.count("instance") == 52
    conn.close()
    engine.close()


def test_a_restarted_wal_is_trimmed_to_the_limit(tmp_path: Path) -> None:
    limit = 256 * 1024  # more than one document's pages, less than 200 documents'
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine._connections._pragmas += (f"PRAGMA journal_size_limit={limit}",)
    engine.ensure_ready("instance")
    engine._connections.checkpointer.close()
    engine.bulk(ops_of(range(200)))
    wal = tmp_path / "index.db-wal"
    assert wal.stat().st_size > limit
    conn = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    Checkpointer(tmp_path / "index.db", timeout=1.0, restart_at=1).checkpoint(conn)
    engine.bulk(ops_of(range(200, 201)))
    assert wal.stat().st_size == limit
    conn.close()
    engine.close()


def test_every_connection_limits_the_wal_file(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    limit = engine._connections.checkpointer.restart_at
    assert engine._conn().execute("PRAGMA journal_size_limit").fetchone()[0] == limit
    engine.close()


def test_no_wal_file_is_no_checkpoint(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "absent.db", timeout=1.0)
    conn = sqlite3.connect(":memory:")
    checkpointer.checkpoint(conn)
    assert checkpointer.checkpoints == 0
    conn.close()
