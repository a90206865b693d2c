"""Real outages for tests: a part made unavailable for real, not a mock raising."""

from __future__ import annotations

from pathlib import Path

from cellsight.cells.mappings import CellMapping, CellRegistry


def lose(registry: CellRegistry, cell: CellMapping) -> None:
    """The cell's SQLite file is gone (its pooled connections closed, so the next one
    meets the missing file: ``DatabaseMissing``, a ``DatabaseUnavailable``)."""
    engine = registry.cell_engine(cell)
    database = Path(engine.url.database or "")
    for path in database.parent.glob(f"{database.name}*"):  # with its -wal and -shm
        path.unlink()
    engine.dispose()
