"""SQLite files: an engine opens an existing one only; ``create_database`` (and the
paths that make databases: ``add_cell``, the seeder) creates a missing one."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cells.database import Engines, connect, create_database, create_engine
from cellsight.cells.errors import DatabaseMissing, DatabaseUnavailable
from cellsight.cells.mappings import CellRegistry


def test_an_engine_does_not_create_a_missing_file_or_its_directory(tmp_path: Path) -> None:
    db = tmp_path / "typo" / "cell.db"
    engines = Engines()
    try:
        with pytest.raises(DatabaseMissing) as missing, connect(engines.get(f"sqlite:///{db}")):
            pass
    finally:
        engines.dispose()
    assert isinstance(missing.value, DatabaseUnavailable)  # handled where an outage is
    assert missing.value.message == f"SQLite database file {str(db)!r} does not exist"
    assert missing.value.path == str(db)
    assert not (tmp_path / "typo").exists()


# The path goes into a file: URI: what a URI reads as syntax (#, %) is escaped.
@pytest.mark.parametrize("name", ["cell.db", "odd #%20name.db"])
def test_create_database_makes_the_file_an_engine_then_opens(tmp_path: Path, name: str) -> None:
    db = tmp_path / "new" / name
    url = f"sqlite:///{str(db).replace('%', '%25')}"  # URLs are percent-decoded
    create_database(url)
    assert db.is_file()
    create_database(url)  # an existing file is left as it is
    engine = create_engine(url)
    try:
        with connect(engine) as conn:
            assert conn.execute(sa.text("PRAGMA journal_mode")).scalar_one() == "wal"
    finally:
        engine.dispose()
    assert [p.name for p in (tmp_path / "new").glob("*.db")] == [name]  # no look-alike


def test_in_memory_databases_still_open() -> None:
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?uri=true"):
        engine = create_engine(sa.make_url(url))  # parse_url refuses them; engines do not
        try:
            with connect(engine) as conn:
                assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
        finally:
            engine.dispose()


def test_a_file_uri_with_its_own_mode_opens_as_given(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    create_database(f"sqlite:///{db}")
    engine = create_engine(sa.make_url(f"sqlite:///file:{db}?mode=ro&uri=true"))
    try:
        with connect(engine) as conn, pytest.raises(sa.exc.OperationalError):
            conn.execute(sa.text("CREATE TABLE t (n INTEGER)"))  # read-only, as asked
    finally:
        engine.dispose()


def test_a_file_uri_without_a_mode_is_not_created(tmp_path: Path) -> None:
    db = tmp_path / "uri.db"
    engine = create_engine(sa.make_url(f"sqlite:///file:{db}?uri=true"))
    try:
        with pytest.raises(DatabaseMissing), connect(engine):
            pass
    finally:
        engine.dispose()
    assert not db.exists()


def test_only_add_cell_creates_a_cell_file(tmp_path: Path) -> None:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    try:
        registry.create_schema()
        cell = registry.add_cell("c1", f"sqlite:///{tmp_path / 'cells' / 'c1.db'}")
        assert (tmp_path / "cells" / "c1.db").is_file()
        with pytest.raises(DatabaseMissing):
            registry.add_cell("c2", f"sqlite:///{tmp_path / 'c2.db'}", create_schema=False)
        assert not (tmp_path / "c2.db").exists()
        with connect(registry.cell_engine(cell)) as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM instances")).scalar_one() == 0
    finally:
        registry.close()
