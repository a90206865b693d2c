"""Commands run at once on a new data directory all open it (an adversarial probe: of
four ``cells list`` on a fresh directory, one or two exited 1 with "database is
locked": each looked for the API tables in a deferred transaction and then created
them, and SQLite fails such a lock upgrade at once instead of waiting)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cellsight import sqlite_pragmas
from cellsight.cells.database import create_database, create_engine
from cellsight.cells.schema import create_cell_schema
from cellsight.sqlite_pragmas import apply_pragma
from tests.support.together import run_together

AT_ONCE = 4


def _all_at_once(data: Path, *args: str) -> list[subprocess.CompletedProcess[str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    command = [sys.executable, "-m", "cellsight", "--data-dir", str(data), *args]
    running = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean,
            cwd=data.parent,
        )
        for _ in range(AT_ONCE)
    ]
    done = []
    for process in running:
        out, err = process.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(command, process.returncode, out, err))
    return done


@pytest.mark.parametrize("trial", range(5))
def test_commands_at_once_on_a_new_data_directory(tmp_path: Path, trial: int) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for result in _all_at_once(data, "cells", "list"):
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""


def test_cell_schema_made_at_once_by_several_connections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'cell.db'}"
    create_database(url)  # the file: the tables are what the connections race to make
    engines = [create_engine(url) for _ in range(AT_ONCE)]
    failures, _ = run_together([lambda n: create_cell_schema(engines[n])] * AT_ONCE, caplog)
    for e in engines:
        e.dispose()
    assert failures == []


def test_a_busy_pragma_is_tried_again_until_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        apply_pragma(other, "PRAGMA journal_mode=WAL", 0.05)  # still held: gives up
    refused = threading.Event()
    classify = sqlite_pragmas.is_busy

    def watching(exc: BaseException) -> bool:
        busy = classify(exc)
        refused.set() if busy else None
        return busy

    monkeypatch.setattr(sqlite_pragmas, "is_busy", watching)
    with ThreadPoolExecutor(1) as pool:
        switching = pool.submit(apply_pragma, other, "PRAGMA journal_mode=WAL", 30)
        assert refused.wait(10), "the pragma never found the file locked"
        assert not switching.done()  # it waits: tried again, not failed
        holder.execute("COMMIT")
        switching.result(timeout=30)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
