"""The embedded index's file removed or replaced while an engine has it open (``rm
index.db*`` to start afresh): nothing is written on into the removed file; the engine
opens the path anew, says so, and the indexer makes its indexes again there."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from cellsight.indexer.engines.base import EngineError, EngineUnavailable, IndexMissing, WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.writer import BatchWriter
from tests.support import novagen
from tests.support.waiting import wait_for

DOC = {"uuid": "u1", "display_name": "a", "deleted": False}


def _files(path: Path) -> list[Path]:
    return [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]


def _write(engine: EmbeddedEngine, doc_id: str, version: int) -> None:
    (result,) = engine.bulk([WriteOp("instance", doc_id, version, {**DOC, "uuid": doc_id})])
    assert result.status.value == "ok", result


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_the_engine_opens_the_path_anew(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "index.db"
    engine = EmbeddedEngine(path)
    engine.ensure_ready("instance")
    _write(engine, "u1", 1)
    if how == "removed":
        for f in _files(path):
            f.unlink()
    else:  # a copy of another index put in its place (a restore)
        other = EmbeddedEngine(tmp_path / "other.db")
        other.ensure_ready("instance")
        _write(other, "u9", 1)
        other.close()
        for f in _files(path):
            f.unlink()
        shutil.copy(tmp_path / "other.db", path)
    with caplog.at_level(logging.WARNING):
        if how == "removed":
            with pytest.raises(IndexMissing):  # an empty file: no aliases yet
                _write(engine, "u2", 1)
            engine.ensure_ready("instance")
            _write(engine, "u2", 1)
        else:
            _write(engine, "u2", 1)
    assert "was removed or replaced while open" in caplog.text
    engine.refresh("instance")
    # What the engine writes now is in the file at the path, for every new reader too.
    reader = EmbeddedEngine(path)
    assert reader.get("instance", "u2") is not None
    assert reader.get("instance", "u1") is None
    assert (reader.get("instance", "u9") is not None) == (how == "replaced")
    reader.close()
    engine.close()


def test_every_thread_of_the_engine_leaves_the_removed_file(tmp_path: Path) -> None:
    """The API reads on a pool of threads: each one's connection is closed and opened
    anew, none reads the removed file's documents afterwards."""
    path = tmp_path / "index.db"
    engine = EmbeddedEngine(path)
    engine.ensure_ready("instance")
    _write(engine, "u1", 1)
    seen: list[object] = []

    def read() -> None:
        seen.append(engine.get("instance", "u1"))

    first = threading.Thread(target=read)
    first.start()
    first.join()
    assert seen[0] is not None
    for f in _files(path):
        f.unlink()
    engine.ensure_ready("instance")  # this thread opens the new file
    second = threading.Thread(target=read)
    second.start()
    second.join()
    assert seen[1] is None
    engine.close()


def test_the_indexer_writes_on_into_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    engine = EmbeddedEngine(path)
    writer = BatchWriter(engine, max_backoff=0.1, record_metrics=False)
    (first,) = writer.write([novagen.body(novagen.notification("instance.create.end", seed=1))])
    assert first.verdict.value == "indexed"
    for f in _files(path):
        f.unlink()
    (second,) = writer.write([novagen.body(novagen.notification("instance.update", seed=2))])
    assert second.verdict.value == "indexed"
    reader = EmbeddedEngine(path)
    assert reader.count("instance") == 1
    reader.close()
    engine.close()


def test_a_reader_mid_transaction_is_never_closed_under_its_feet(tmp_path: Path) -> None:
    """Another thread notices the removal while a reader is inside a transaction: the
    reader finishes on the connection it began with (sqlite3 crashed the process, or
    raised its own ProgrammingError, when another thread closed it)."""
    path = tmp_path / "index.db"
    engine = EmbeddedEngine(path)
    engine.ensure_ready("instance")
    inside, removed = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def reader() -> None:
        try:
            with engine._connections.transaction(write=False) as catalog:
                inside.set()
                assert removed.wait(10)
                catalog.conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
            outcome.append(None)
        except BaseException as exc:  # surfaced below
            outcome.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    assert inside.wait(10)
    for f in _files(path):
        f.unlink()
    engine.ensure_ready("instance")  # this thread opens the new file
    removed.set()
    thread.join()
    assert outcome == [None]
    engine.close()


def test_many_readers_and_a_removal(tmp_path: Path) -> None:
    """The API's pool of readers while the file is removed and the indexes made again:
    each read answers, or is the engine's own error, never the driver's."""
    path = tmp_path / "index.db"
    engine = EmbeddedEngine(path)
    engine.ensure_ready("instance")
    for i in range(50):
        _write(engine, f"u{i}", 1)
    stop = threading.Event()
    unexpected: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                engine.get("instance", "u1")
                engine.count("instance")
            except EngineError:
                pass  # IndexMissing until the indexes are made again
            except BaseException as exc:  # surfaced below
                unexpected.append(exc)
                return

    readers = [threading.Thread(target=read, daemon=True) for _ in range(12)]
    for t in readers:
        t.start()
    try:
        for f in _files(path):
            f.unlink(missing_ok=True)  # the readers may be opening the path meanwhile
        engine.ensure_ready("instance")
        _write(engine, "u1", 2)
        wait_for(lambda: all(t.is_alive() for t in readers) and engine.get("instance", "u1"))
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert unexpected == []
    assert engine.count("instance") == 1
    engine.close()


def test_a_new_thread_first_to_the_new_file_makes_its_catalog(tmp_path: Path) -> None:
    """A pool thread that starts after the removal opens the new file before the thread
    that held the old one notices: the catalog is made for the new file all the same,
    and the old file is left by every thread that has ended."""
    path = tmp_path / "index.db"
    engine = EmbeddedEngine(path)
    engine.ensure_ready("instance")
    old = threading.Thread(target=lambda: engine.indexes("instance"))
    old.start()
    old.join()
    for f in _files(path):
        f.unlink()
    seen: list[BaseException] = []

    def first() -> None:
        try:
            engine.get("instance", "u1")
        except IndexMissing:
            pass  # no aliases yet: the catalog exists
        except BaseException as exc:  # surfaced below
            seen.append(exc)

    fresh = threading.Thread(target=first)
    fresh.start()
    fresh.join()
    assert seen == []
    engine.ensure_ready("instance")  # the main thread moves to the new file
    _write(engine, "u1", 1)
    held = {identity for _, identity, _ in engine._connections._all}
    assert held == {engine._connections.identity_now()}
    engine.close()


def test_an_open_that_keeps_failing_gives_up_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opens meeting I/O errors are tried again (files being removed and made again),
    but a disk that keeps failing is the engine's EngineUnavailable within its timeout,
    not a hang. No real disk fails on demand: the open is replaced by one that does."""
    engine = EmbeddedEngine(tmp_path / "index.db", timeout=0.05)
    tries: list[int] = []

    def failing_open() -> object:
        tries.append(1)
        exc = sqlite3.OperationalError("disk I/O error")
        exc.sqlite_errorcode = sqlite3.SQLITE_IOERR
        raise exc

    monkeypatch.setattr(engine._connections, "_open", failing_open)
    with pytest.raises(EngineUnavailable, match="I/O error"):
        engine.ping()
    assert len(tries) > 3  # more than the three tries that once gave up too soon
