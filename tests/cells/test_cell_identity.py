"""One database, one cell, whatever URL names it (``cells.identity``): the URL check
alone let a second URL of the same database register it again (another query option, a
SQLite file named by a ``file:`` URI), and every instance in it was then listed twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cells.cell_removal import remove_cell
from cellsight.cells.errors import BlankText, DuplicateCell, safe_url
from cellsight.cells.identity import registered_as
from cellsight.cells.mappings import CellRegistry
from tests.support.services import DIALECTS, DatabaseFactory


def _alias(url: str) -> str:
    """Another URL of the same database."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"sqlite:///file:{parsed.database}?uri=true"  # a URI: its path is not resolved
    return parsed.update_query_dict({"connect_timeout": "9"}).render_as_string(hide_password=False)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_database_registered_under_another_url_is_refused(
    dialect: str, make_database: DatabaseFactory, tmp_path: Path
) -> None:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    url = make_database(dialect)
    east = registry.add_cell("east", url)
    alias = _alias(url)
    assert safe_url(alias) != east.database_url  # the URL check alone would pass it
    with pytest.raises(DuplicateCell, match="is already registered") as refused:
        registry.add_cell("west", alias)
    assert refused.value.value == safe_url(east.database_url)  # names the cell's own URL
    assert [c.name for c in registry.list_cells()] == ["east"]
    assert registered_as(registry.engines.get(east.database_url)) == east.uuid
    # A cell removed leaves its database as it is, mark included: registered again
    # under the other URL, it is marked as the new cell.
    registry.set_disabled(east.name, True)
    remove_cell(registry, east.name)
    west = registry.add_cell("west", alias)
    assert registered_as(registry.engines.get(west.database_url)) == west.uuid
    assert [c.name for c in registry.list_cells()] == ["west"]
    registry.close()


def test_a_database_registered_before_the_mark_existed_is_marked_when_added(
    tmp_path: Path,
) -> None:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    cell = registry.add_cell("east", f"sqlite:///{tmp_path / 'east.db'}")
    engine = registry.engines.get(cell.database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE cell_meta"))
    assert registered_as(engine) is None  # as a database registered by an older version
    registry.set_disabled(cell.name, True)
    remove_cell(registry, cell.name)
    again = registry.add_cell("east", cell.database_url)
    assert registered_as(registry.engines.get(again.database_url)) == again.uuid
    registry.close()


def test_a_copy_of_a_registered_database_is_another_database(tmp_path: Path) -> None:
    """A restored backup carries the mark of the cell it was copied from, but a token
    written through its URL is not read through that cell's: it may be registered."""
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    east = registry.add_cell("east", f"sqlite:///{tmp_path / 'east.db'}")
    registry.engines.dispose()  # the last connection closed: the WAL is in the file
    shutil.copy(tmp_path / "east.db", tmp_path / "copy.db")
    assert registered_as(registry.engines.get(f"sqlite:///{tmp_path / 'copy.db'}")) == east.uuid
    copy = registry.add_cell("copy", f"sqlite:///{tmp_path / 'copy.db'}")
    assert registered_as(registry.engines.get(copy.database_url)) == copy.uuid
    assert registered_as(registry.engines.get(east.database_url)) == east.uuid
    for cell in (east, copy):  # the probe's token is gone from both
        with registry.engines.get(cell.database_url).connect() as conn:
            keys = conn.execute(sa.text("SELECT key FROM cell_meta")).scalars().all()
        assert keys == ["cell_uuid"]
    registry.close()


@pytest.mark.parametrize("name", ["", "   "])
def test_a_blank_cell_name_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    """The registry's own check, as every other name's (``check_name``): the CLI refuses
    it first, a library caller got a bare ValueError."""
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    with pytest.raises(BlankText, match=r"^cell name must not be empty"):
        registry.add_cell(name, f"sqlite:///{tmp_path / 'east.db'}")
    assert registry.list_cells() == []
    assert not (tmp_path / "east.db").exists()  # refused before any database is made
    registry.close()


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("spelling", ["C1", " c1", "c1 ", "\u00a0C1"])
def test_a_name_differing_only_in_case_or_spaces_is_taken(
    dialect: str, spelling: str, make_database: DatabaseFactory, tmp_path: Path
) -> None:
    """A review: " c1" and "C1" were registered beside "c1" (a listing could not tell
    them apart). Every API database dialect now refuses them alike, naming the cell it
    meant."""
    registry = CellRegistry(make_database(dialect))
    registry.create_schema()
    try:
        registry.add_cell("c1", f"sqlite:///{tmp_path / 'c1.db'}")
        with pytest.raises(DuplicateCell, match=r"is already registered \(as 'c1'\)") as refused:
            registry.add_cell(spelling, f"sqlite:///{tmp_path / 'other.db'}")
        assert refused.value.field == "name" and refused.value.value == spelling
        assert [c.name for c in registry.list_cells()] == ["c1"]
        assert not (tmp_path / "other.db").exists()  # refused before its database was made
        # Non-ASCII letters fold too (SQLite's lower() would not have folded them).
        registry.add_cell("Östra", f"sqlite:///{tmp_path / 'o.db'}")
        with pytest.raises(DuplicateCell, match="as 'Östra'"):
            registry.add_cell("östra", f"sqlite:///{tmp_path / 'o2.db'}")
    finally:
        registry.close()
