"""A SQLite file's storage errors say what the file system says: SQLite's own "disk I/O
error" was all a cell on a full file system reported, for reads and writes alike."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight import sqlite_storage
from cellsight.indexer.engines.sqlite_connections import translate
from cellsight.sqlite_storage import LOW_FREE, described, explained

ROOT = Path(__file__).resolve().parents[2]


def _stat(*, free_blocks: int, read_only: bool = False) -> os.statvfs_result:
    flag = os.ST_RDONLY if read_only else 0
    return os.statvfs_result((4096, 4096, 1000, free_blocks, free_blocks, 100, 50, 50, flag, 255))


def test_a_read_only_or_nearly_full_file_system_is_named_with_its_figure() -> None:
    path = Path("/data/cell1.db")
    assert described(path, _stat(free_blocks=900, read_only=True)) == (
        "the file system holding /data/cell1.db is mounted read-only"
    )
    assert described(path, _stat(free_blocks=3)) == (
        "the file system holding /data/cell1.db is full, 12,288 bytes free"
    )
    assert described(path, _stat(free_blocks=LOW_FREE // 4096)) is None  # 1 MiB free


def test_only_storage_errors_ask_the_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.db"
    sqlite3.connect(path).close()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as readonly:
        conn.execute("CREATE TABLE t (a)")
    with pytest.raises(sqlite3.OperationalError) as syntax:
        conn.execute("SELEC 1")
    conn.close()
    assert readonly.value.sqlite_errorcode == sqlite3.SQLITE_READONLY
    assert explained(readonly.value, path) is None  # a healthy file system: nothing to add
    said = "the file system holding it is full, 0 bytes free"
    monkeypatch.setattr(sqlite_storage, "storage_state", lambda p: said)  # as if full
    assert explained(readonly.value, path) == said
    assert explained(syntax.value, path) is None  # by the error's code, not the disk's state
    assert explained(ValueError("disk I/O error"), path) is None
    assert explained(readonly.value, None) is None
    # The embedded index's errors say it too.
    error = translate(readonly.value, path)
    assert str(error) == f"index database {path}: attempt to write a readonly database ({said})"


@pytest.fixture
def small_file_system(tmp_path: Path) -> Iterator[Path]:
    """A 400 KiB tmpfs: a real full file system (needs the right to mount one)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CELLSIGHT_DATA_DIR": str(data)}
    return subprocess.run(
        [sys.executable, "-m", "cellsight", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_a_cell_on_a_full_file_system_says_so(tmp_path: Path, small_file_system: Path) -> None:
    data = tmp_path / "data"
    cell = small_file_system / "cell.db"
    assert (
        _cli(data, "cells", "add", "--name", "small", "--db-url", f"sqlite:///{cell}").returncode
        == 0
    )
    assert _cli(data, "cells", "add-host", "--cell", "small", "--host", "h1").returncode == 0
    for name in ("cell.db-wal", "cell.db-shm"):  # as after a clean close: made anew
        (small_file_system / name).unlink(missing_ok=True)
    fd = os.open(small_file_system / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):  # every block left
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    boot = _cli(
        data, "ops", "boot", "--cell", "small", "--name", "vm", "--flavor", "m1.small",
        "--project", "p1", "--user", "u1",
    )  # fmt: skip
    assert boot.returncode == 1, boot.stderr
    line = boot.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert f"the file system holding {cell} is full" in line and "Traceback" not in line
