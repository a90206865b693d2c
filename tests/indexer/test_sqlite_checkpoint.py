"""The embedded index's WAL checkpoints run on their own thread: the writing connection
only checkpoints past a large fallback threshold, readers are left as they are, the
WAL is emptied once it passes its limit, and closing the engine stops the thread."""

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


def test_a_wal_past_its_limit_is_emptied(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    engine._connections.checkpointer.close()  # this test checkpoints by hand
    engine.bulk(ops_of(range(50)))
    wal = tmp_path / "index.db-wal"
    assert wal.stat().st_size > 0
    by_hand = Checkpointer(tmp_path / "index.db", timeout=1.0, truncate_at=1)
    conn = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    by_hand.checkpoint(conn)
    assert (by_hand.checkpoints, by_hand.truncations) == (1, 1)
    assert wal.stat().st_size == 0
    # Under the limit, a passive checkpoint copies without emptying the file.
    engine.bulk(ops_of(range(50, 60)))
    patient = Checkpointer(tmp_path / "index.db", timeout=1.0)
    patient.checkpoint(conn)
    assert (patient.checkpoints, patient.truncations) == (1, 0)
    assert wal.stat().st_size > 0
    assert engine.count("instance") == 60
    conn.close()
    engine.close()


def test_no_wal_file_is_no_checkpoint(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "absent.db", timeout=1.0)
    conn = sqlite3.connect(":memory:")
    checkpointer.checkpoint(conn)
    assert checkpointer.checkpoints == 0
    conn.close()
