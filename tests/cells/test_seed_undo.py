"""A seed that fails or is interrupted leaves nothing it made, on every dialect. Found
from outside: Ctrl-C left registered cells holding part of their rows, no compute
nodes, no indexes and (from the parallel path) no mappings, a rerun made new cells
beside them and the demo reused them; a bad second URL left the first cell registered.
The interruption is injected where the seed reports progress (after a chunk), so it is
the same every run."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cells.errors import BadDatabaseURL, DatabaseUnavailable
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.seed import seed
from tests.support.cell_contract import NOW
from tests.support.refusals import allow_deletes, refuse_deletes
from tests.support.services import DatabaseFactory


def interrupt_after(calls: int) -> Callable[[int], None]:
    seen = [0]

    def progress(_: int) -> None:
        seen[0] += 1
        if seen[0] >= calls:
            raise KeyboardInterrupt

    return progress


def tables_of(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()


def made_nothing(registry: CellRegistry, urls: list[str], dialect: str) -> None:
    assert registry.list_cells() == []
    assert registry.count_mappings() == 0
    for url in urls:
        if dialect == "sqlite":
            assert not Path(url.removeprefix("sqlite:///")).exists()
        else:
            assert tables_of(url) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_an_interrupted_seed_leaves_nothing_it_made_and_a_rerun_starts_clean(
    registry: CellRegistry,
    make_database: DatabaseFactory,
    dialect: str,
    tmp_path: Path,
    workers: int,
) -> None:
    urls = [make_database(dialect), make_database(dialect)]
    with pytest.raises(KeyboardInterrupt, match=r"the cells it made \(cell1, cell2\) are unreg"):
        seed(
            registry, cells=2, instances_per_cell=60, cells_dir=tmp_path, db_urls=urls,
            chunk_size=20, now=NOW, workers=workers, progress=interrupt_after(2),
        )  # fmt: skip
    made_nothing(registry, urls, dialect)
    report = seed(
        registry, cells=2, instances_per_cell=60, cells_dir=tmp_path, db_urls=urls,
        chunk_size=20, now=NOW, workers=workers,
    )  # fmt: skip
    assert [c.name for c in report.cells] == ["cell1", "cell2"]
    assert registry.count_mappings() == 120 == report.instances


def test_a_seed_interrupted_before_registering_drops_the_tables_it_made(
    registry: CellRegistry,
    make_database: DatabaseFactory,
    dialect: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupt probe: a seed interrupted after making a server cell's tables, before
    registering it, left them (the undo dropped only registered cells' tables)."""
    urls = [make_database(dialect)]

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "add_cell", interrupted)
    with pytest.raises(KeyboardInterrupt, match="it had registered no cell yet"):
        seed(registry, cells=1, instances_per_cell=5, cells_dir=tmp_path, db_urls=urls, now=NOW)
    monkeypatch.undo()
    made_nothing(registry, urls, dialect)


def test_a_seed_whose_later_url_fails_registers_none_and_keeps_what_was_there(
    registry: CellRegistry, make_database: DatabaseFactory, dialect: str, tmp_path: Path
) -> None:
    kept = seed(
        registry, cells=1, instances_per_cell=5, cells_dir=tmp_path,
        db_urls=[make_database(dialect)], now=NOW,
    )  # fmt: skip
    fresh = make_database(dialect)
    with pytest.raises(BadDatabaseURL, match="'foo'"):
        seed(registry, cells=2, instances_per_cell=5, cells_dir=tmp_path, db_urls=[fresh, "foo"])
    unreachable = {
        "sqlite": "sqlite:////proc/no/such/dir/cell.db",
        "postgresql": "postgresql://u@127.0.0.1:1/db",
        "mariadb": "mysql://root@127.0.0.1:1/db",
    }[dialect]
    with pytest.raises(DatabaseUnavailable):
        seed(
            registry, cells=2, instances_per_cell=5, cells_dir=tmp_path,
            db_urls=[fresh, unreachable],
        )  # fmt: skip
    assert [c.uuid for c in registry.list_cells()] == [c.uuid for c in kept.cells]
    assert registry.count_mappings() == 5
    made_nothing_new = fresh.removeprefix("sqlite:///")
    if dialect == "sqlite":
        assert not Path(made_nothing_new).exists()
    else:
        assert tables_of(fresh) == []


def test_a_failed_seed_leaves_a_sqlite_file_it_did_not_create(tmp_path: Path) -> None:
    """The file is the run's only if the run created it (exclusively): one that was
    there, or that another process made meanwhile, is not removed (found by a review:
    two seeds at once both took ``cell1.db`` for their own)."""
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    theirs = tmp_path / "theirs.db"
    theirs.touch()
    with pytest.raises(DatabaseUnavailable):
        seed(
            registry, cells=2, instances_per_cell=5, cells_dir=tmp_path,
            db_urls=[f"sqlite:///{theirs}", "sqlite:////proc/no/such/dir/cell.db"],
        )  # fmt: skip
    assert theirs.exists()
    assert registry.list_cells() == []
    registry.close()


def test_a_second_ctrl_c_during_the_undo_waits_until_it_is_done(
    registry: CellRegistry,
    make_database: DatabaseFactory,
    dialect: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An impatient second Ctrl-C, raised halfway through the undo, left the cells
    unregistered but their files and tables in place."""
    urls = [make_database(dialect)]
    interrupted: list[int] = []
    dispose = registry.engines.dispose

    def pressed_again() -> None:
        if interrupted and len(interrupted) < 2:
            interrupted.append(2)
            os.kill(os.getpid(), signal.SIGINT)  # between unregistering and removing
        dispose()

    def progress(_: int) -> None:
        interrupted.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(registry.engines, "dispose", pressed_again)
    with pytest.raises(KeyboardInterrupt):
        seed(
            registry, cells=1, instances_per_cell=40, cells_dir=tmp_path, db_urls=urls,
            chunk_size=20, now=NOW, workers=1, progress=progress,
        )  # fmt: skip
    assert interrupted == [1, 2]
    made_nothing(registry, urls, dialect)


def test_a_seed_that_cannot_unregister_its_cells_keeps_their_databases(
    registry: CellRegistry,
    make_database: DatabaseFactory,
    dialect: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A probe: a seed that filled the disk could not unregister its cell and removed the
    cell's SQLite file all the same; every sync and verify then failed on the cell."""
    urls = [make_database(dialect), make_database(dialect)]
    refuse_deletes(registry.api_engine, "cell_mappings", dialect)
    try:
        with pytest.raises(KeyboardInterrupt):
            seed(
                registry, cells=2, instances_per_cell=60, cells_dir=tmp_path, db_urls=urls,
                chunk_size=20, now=NOW, workers=1, progress=interrupt_after(2),
            )  # fmt: skip
        assert "could not unregister the seeded cells" in caplog.text
        cells = registry.list_cells()
        assert len(cells) == 2
        for cell in cells:  # registered, so readable: its database and tables are there
            assert "instances" in tables_of(cell.database_url)
    finally:
        allow_deletes(registry.api_engine, "cell_mappings", dialect)
