"""``cellsight index purge`` holds the maintenance lock a sync or verify holds: a purge
and a sync (or verify, or another purge) never run at once, and the one refused says,
in one line, what holds the lock (exit 3, as for a second sync)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from cellsight.cells.mappings import CellRegistry
from cellsight.cli import _register, app
from cellsight.cli.errors import LOCKED
from cellsight.clients import build_engine
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.lock import MaintenanceLock, lock_key
from cellsight.indexer.purge import (
    PURGE_FLOOR_KEY,
    purge_tombstones,
    read_database_floor,
    read_floor,
)
from cellsight.settings import Settings
from tests.support.sync_world import seeded_settings

runner = CliRunner()
ME = f"{socket.gethostname()}:{os.getpid()}"


@pytest.fixture
def synced(tmp_path: Path) -> Settings:
    settings = seeded_settings(tmp_path / "data")
    _register()
    assert cli(settings, "sync").exit_code == 0
    return settings


@pytest.fixture
def engine(synced: Settings) -> Iterator[SearchEngine]:
    engine = build_engine(synced)
    yield engine
    engine.close()


def cli(settings: Settings, *args: str) -> Any:
    return runner.invoke(app, ["--data-dir", str(settings.data_dir), "index", *args])


def refused(result: Any, holder: str) -> None:
    """Exit 3 and one line naming the holder: its purpose, host and pid."""
    err = result.stderr.strip()
    assert result.exit_code == LOCKED, (result.exit_code, result.output)
    assert len(err.splitlines()) == 1 and "Traceback" not in result.output, err
    assert err.startswith("error: another instance sync, verify or purge is running: "), err
    assert f"a {holder} by {ME} since " in err, err


def test_a_purge_waits_for_no_sync(synced: Settings, engine: SearchEngine) -> None:
    registry = CellRegistry.from_settings(synced)
    with MaintenanceLock(engine, "instance", "sync"):
        result = cli(synced, "purge", "--older-than", "0s")
        refused(result, "sync")
        assert engine.get_meta(PURGE_FLOOR_KEY) is None  # refused before it did anything
        assert read_database_floor(registry) is None
    with MaintenanceLock(engine, "instance", "verify"):
        refused(cli(synced, "purge", "--older-than", "0s"), "verify")
    with MaintenanceLock(engine, "node", "sync"):  # another resource's lock: no matter
        done = cli(synced, "purge", "--older-than", "0s")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("purged "), done.output
    assert engine.get_meta(PURGE_FLOOR_KEY) is not None
    # The API database holds the same floor, for an API that cannot reach the index.
    assert read_database_floor(registry) == read_floor(engine) is not None
    assert engine.get_meta(lock_key("instance"))["released"]  # type: ignore[index]
    registry.close()


class Paused:
    """The engine, with a purge held once it holds the lock (before its first read of the
    tombstones) until ``go`` is set."""

    def __init__(self, inner: SearchEngine) -> None:
        self.inner = inner
        self.inside = threading.Event()
        self.go = threading.Event()

    def iter_tombstones(self, *args: Any, **kwargs: Any) -> Any:
        self.inside.set()
        assert self.go.wait(60), "the test never let the purge go on"
        return self.inner.iter_tombstones(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_nothing_else_runs_beside_a_purge(synced: Settings, engine: SearchEngine) -> None:
    paused = Paused(engine)
    removed: list[int] = []
    purge = threading.Thread(
        target=lambda: removed.append(
            purge_tombstones(cast(SearchEngine, paused), datetime.now(UTC))
        )
    )
    purge.start()
    try:
        assert paused.inside.wait(30), "the purge did not start"
        refused(cli(synced, "sync"), "purge")
        refused(cli(synced, "sync", "--cell", "cell1"), "purge")
        refused(cli(synced, "verify", "--type", "instance"), "purge")
        refused(cli(synced, "purge", "--older-than", "0s"), "purge")
    finally:
        paused.go.set()
        purge.join(60)
    assert len(removed) == 1  # it went on, and finished
    assert engine.get_meta(lock_key("instance"))["released"]  # type: ignore[index]
    assert cli(synced, "sync").exit_code == 0  # free again once the purge is done


@pytest.mark.parametrize(
    "value", ["abc", "-1d", "99999999999999d", "740000d", "20000000h", "9" * 5000 + "s", "٣d"]
)
def test_a_bad_age_is_a_usage_error_naming_the_option(tmp_path: Path, value: str) -> None:
    """An adversarial probe: an age past the calendar's start was an "internal error"
    (OverflowError), naming neither the option nor its value."""
    _register()
    result = runner.invoke(
        app, ["--data-dir", str(tmp_path / "d"), "index", "purge", "--older-than", value]
    )
    err = result.stderr.strip()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(err.splitlines()) == 1 and err.startswith("error: --older-than: "), err
    assert "internal" not in err and "Traceback" not in result.output
