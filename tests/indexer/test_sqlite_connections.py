"""Opening the embedded index: switching a new file to WAL needs a lock SQLite does not
wait for (its busy timeout is not consulted), so the switch itself is retried while the
file is locked, up to the engine's timeout, and then fails as the engine being down."""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cellsight.indexer.engines import sqlite_connections
from cellsight.indexer.engines.base import EngineUnavailable
from cellsight.indexer.engines.embedded import EmbeddedEngine


def _locked(path: Path) -> sqlite3.Connection:
    """Another connection about to write ``path`` (a rollback-journal file): against its
    reserved lock the WAL switch fails at once, whatever the busy timeout (measured)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE held (x)")
    holder.execute("BEGIN IMMEDIATE")
    return holder


def _watch_busy(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the retry sees the file locked (the real classification, observed)."""
    seen = threading.Event()
    classify = sqlite_connections._busy

    def watching(exc: BaseException) -> bool:
        busy = classify(exc)
        if busy:
            seen.set()
        return busy

    monkeypatch.setattr(sqlite_connections, "_busy", watching)
    return seen


def test_opening_waits_until_the_file_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = _locked(tmp_path / "index.db")
    refused = _watch_busy(monkeypatch)
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="t", timeout=30.0)
    with ThreadPoolExecutor(1) as pool:
        opening = pool.submit(engine.ensure_ready, "instance")
        assert refused.wait(10), "the journal switch never found the file locked"
        assert not opening.done()
        holder.execute("COMMIT")
        opening.result(timeout=30)
    assert engine._conn().execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert engine.count("instance") == 0
    engine.close()
    holder.close()


def test_a_file_that_stays_locked_is_the_engine_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = _locked(tmp_path / "index.db")
    refused = _watch_busy(monkeypatch)
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="t", timeout=0.3)
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="index database busy"):
        engine.ensure_ready("instance")
    assert refused.is_set()
    assert time.monotonic() - started >= 0.3
    holder.execute("ROLLBACK")
    holder.close()
    engine.close()
