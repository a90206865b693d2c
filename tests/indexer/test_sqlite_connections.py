"""Opening the embedded index: switching a new file to WAL needs a lock SQLite does not
wait for (its busy timeout is not consulted), so the switch itself is retried while the
file is locked, up to the engine's timeout, and then fails as the engine being down."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cellsight import sqlite_pragmas
from cellsight.indexer.engines.base import EngineUnavailable, WriteOp, WriteStatus
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
    classify = sqlite_pragmas.is_busy

    def watching(exc: BaseException) -> bool:
        busy = classify(exc)
        if busy:
            seen.set()
        return busy

    monkeypatch.setattr(sqlite_pragmas, "is_busy", watching)
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
    # Named by its file: an operator with several data directories knows which.
    named = re.escape(f"index database {tmp_path / 'index.db'} busy")
    with pytest.raises(EngineUnavailable, match=named):
        engine.ensure_ready("instance")
    assert refused.is_set()
    assert time.monotonic() - started >= 0.3
    holder.execute("ROLLBACK")
    holder.close()
    engine.close()


BOUND = [
    (None, ("null", None)),
    (True, ("integer", 1)),
    (False, ("integer", 0)),
    (7, ("integer", 7)),
]


@pytest.mark.parametrize("value, stored", BOUND)
def test_the_registered_adapters_bind_what_sqlite3_bound_without_them(
    value: object, stored: tuple[str, object]
) -> None:
    """The module's adapters for None and bool (a speedup) change no stored value, in any
    connection of the process."""
    if value is not None and type(value) is not bool:
        assert (type(value), sqlite3.PrepareProtocol) not in sqlite3.adapters
    else:
        assert (type(value), sqlite3.PrepareProtocol) in sqlite3.adapters
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (v)")
    conn.execute("INSERT INTO t VALUES (?)", (value,))
    assert conn.execute("SELECT typeof(v), v FROM t").fetchone() == stored
    conn.close()


def test_a_document_s_booleans_and_nulls_are_stored_as_before(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    engine.ensure_ready("instance")
    doc = {"uuid": "u-1", "locked": True, "deleted": False, "host": None}
    assert engine.bulk([WriteOp("instance", "u-1", 1, doc)])[0].status is WriteStatus.OK
    conn = engine._conn()
    (table,) = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 't-instance%' "
        "AND name NOT LIKE '%#%'"
    ).fetchone()
    row = conn.execute(
        f'SELECT typeof("locked"), "locked", typeof("deleted"), "deleted", typeof("host") '
        f'FROM "{table}"'
    )
    assert row.fetchone() == ("integer", 1, "integer", 0, "null")
    engine.close()


def test_the_connections_of_ended_threads_are_closed(
    tmp_path: Path,
) -> None:
    """An adversarial probe: the API's thread pool retires idle threads and starts new
    ones for the next burst; each kept its connection and a 64 MB page cache until the
    engine closed, so every burst added ~200 MB of RSS for good. The connections of
    ended threads now close when another opens."""
    engine = EmbeddedEngine(tmp_path / "index.db", cache_mb=64)
    engine.ensure_ready("instance")  # this thread writes: the engine's cache
    connections = engine._connections

    def read() -> None:
        engine.get("instance", "00000000-0000-4000-8000-000000000000")

    for burst in range(3):
        threads = [threading.Thread(target=read) for _ in range(15)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        opened = [conn for conn, _, _ in connections._all]
        # At most this burst's (all ended) and this thread's: earlier bursts' are closed.
        assert len(opened) <= 16, (burst, len(opened))
    ended = [conn for conn, _, thread in connections._all if not thread.is_alive()]
    last = threading.Thread(target=read)
    last.start()
    last.join()
    for conn in ended:
        with pytest.raises(sqlite3.ProgrammingError):  # closed
            conn.execute("SELECT 1")
    engine.close()
