"""Index against cells, row by row: what the tests and ``scripts/soak.py`` call "the index
equals the cells". Imports nothing of pytest, so the soak can use it too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cellsight.cells import reads, rows
from cellsight.cells.mappings import CellRegistry
from cellsight.indexer.documents import comparable, instance_document
from cellsight.indexer.engines.base import IndexMissing, SearchEngine


@dataclass(frozen=True)
class Drift:
    """How one instance's document differs from its cell row."""

    stored: int | None  # the document's version; None: there is no document
    revision: int  # the cell row's
    fields: tuple[str, ...] = ()

    @property
    def behind(self) -> bool:
        """The index lags the cell (a notification lost or not yet applied); not a
        document ahead of its row, nor one that differs at the same version."""
        return self.stored is None or self.stored < self.revision

    def __str__(self) -> str:
        if self.stored is None:
            return "missing"
        return f"fields {list(self.fields)}, version {self.stored}/{self.revision}"


def index_differences(registry: CellRegistry, engine: SearchEngine) -> dict[str, Drift]:
    """uuid → how its document differs from its cell row (empty: equal). Raises the
    engine's ``IndexMissing`` when there is no instance index at all."""
    engine.refresh("instance")
    diffs: dict[str, Drift] = {}
    for cell in registry.list_cells():
        with registry.cell_engine(cell).connect() as conn:
            for row in reads.iter_instances(conn):
                payload: Any = rows.row_to_payload(row, cell.uuid)
                want = comparable(instance_document(payload, "instance.update", row["revision"]))
                stored = engine.get("instance", row["uuid"])
                if stored is None:
                    diffs[row["uuid"]] = Drift(None, row["revision"])
                    continue
                got = comparable(stored.document)
                bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
                if bad or stored.version != row["revision"]:
                    diffs[row["uuid"]] = Drift(stored.version, row["revision"], tuple(bad))
    return diffs


def index_matches(registry: CellRegistry, engine: SearchEngine) -> bool:
    """Whether the index equals the cells row by row (False while it has no instance
    index yet), for ``wait_for``."""
    try:
        return not index_differences(registry, engine)
    except IndexMissing:
        return False
