"""Set-ups the CLI tests of a failing cell share: that cell beside a healthy SQLite one
holding one instance, synced; and whether a command left the maintenance lock behind."""

from __future__ import annotations

from pathlib import Path

from cellsight.clients import build_engine
from cellsight.indexer.lock import MaintenanceLock
from cellsight.settings import load_settings
from tests.cli.test_cli_errors import cellsight

OWNER = ("--project", "p1", "--user", "u1")


def synced_beside_lite(data: Path, name: str, url: str, lite: str) -> None:
    """Cells ``name`` (``url``) and ``lite`` (one instance, its host h1), then a sync."""
    for args in (
        ("cells", "add", "--name", name, "--db-url", url),
        ("cells", "add", "--name", "lite", "--db-url", lite, "--create"),
        ("cells", "add-host", "--cell", "lite", "--host", "h1"),
        ("ops", "boot", "--cell", "lite", "--name", "vm", "--flavor", "m1.small", *OWNER),
        ("index", "sync"),
    ):
        done = cellsight(data, *args)
        assert done.returncode == 0, (args, done.stderr)


def assert_lock_free(data: Path) -> None:
    """The instance maintenance lock can be taken: no command left it held."""
    engine = build_engine(load_settings(data_dir=data))
    try:
        with MaintenanceLock(engine, "instance", "the next command"):
            pass
    finally:
        engine.close()
