"""What a seed made, undone when it fails or is interrupted.

A seed registers each cell before loading it (its uuid comes from the cell's random
stream) and maps instances chunk by chunk, so a seed stopped halfway left registered
cells with part of their rows, no compute nodes, no indexes and, from the parallel path,
no mappings; a rerun made new cells beside them, and the demo reused them. Found by an
adversarial probe; the README promises exit 130 "cleaned up".

Undone: the cells registered by this run and their instance mappings; the SQLite files
this run created (with their WAL); the cell tables it created in a server database for
a cell it registered. Left as they were: whatever existed before the run (a server
database's tables that were there, an existing SQLite file), which a seed only adds to,
and what another process made meanwhile: a SQLite file is this run's only if this run
created it (exclusively), a server's tables only if this run registered their cell.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from cellsight.cells.database import connect, parse_url, sqlite_file, write_transaction
from cellsight.cells.errors import safe_url
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.schema import cell_mappings, cell_metadata, instance_mappings
from cellsight.signal_events import signals_held

log = logging.getLogger(__name__)


class SeedInterrupted(KeyboardInterrupt):
    """An interrupted seed, saying what became of what it had made."""


@dataclass
class Made:
    """What this run created, recorded as it goes."""

    files: list[Path] = field(default_factory=list)
    schemas: list[str] = field(default_factory=list)  # server database URLs
    cells: list[CellMapping] = field(default_factory=list)

    def database(self, registry: CellRegistry, url: str) -> None:
        """Note ``url``'s database before the seed creates it or its tables."""
        parsed = parse_url(url)
        if parsed.get_backend_name() == "sqlite":
            path = sqlite_file(parsed)
            if path is not None and path.name:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open("x"):  # SQLite takes an empty file as an empty database
                        self.files.append(path)
                except FileExistsError:
                    pass  # there before, or another process's since
                except OSError:
                    pass  # create_database names what is wrong with the path
            return
        with connect(registry.engines.get(url)) as conn:
            if not sa.inspect(conn).get_table_names():
                self.schemas.append(url)

    def undo(self, registry: CellRegistry) -> str:
        """Best effort, each part on its own: one that fails is logged, the rest done.
        Returns what was undone, for an interrupted seed to say."""
        with signals_held():
            kept = self._undo(registry)
        names = ", ".join(c.name for c in self.cells)
        if kept:
            return (
                f"the cells it made ({names}) could not be unregistered and keep their "
                "databases: `cellsight cells disable` and `cells remove` undo each"
            )
        if self.cells:
            # Its tables dropped on a server's database, not the database itself.
            made = "what it created for them removed (SQLite files, tables)"
            return f"the cells it made ({names}) are unregistered and {made}"
        return "it had registered no cell yet; what it had created is removed"

    @staticmethod
    def _registered_now(registry: CellRegistry) -> set[str] | None:
        """The database URLs of the cells registered now; None if that cannot be read."""
        try:
            return {c.database_url for c in registry.list_cells()}
        except Exception as exc:
            log.warning("seed clean-up: the registered cells cannot be read: %s", exc)
            return None

    def _undo(self, registry: CellRegistry) -> set[str]:
        uuids = [c.uuid for c in self.cells]
        kept: set[str] = set()  # the URLs of cells still registered: their data stays
        if uuids:
            try:
                with write_transaction(registry.api_engine) as conn:
                    m = instance_mappings.c
                    conn.execute(instance_mappings.delete().where(m.cell_uuid.in_(uuids)))
                    conn.execute(cell_mappings.delete().where(cell_mappings.c.uuid.in_(uuids)))
            except Exception as exc:
                # Registered cells without their databases fail every sync and verify
                # (a probe: a seed that filled the disk removed cell3.db and left cell3).
                names = ", ".join(c.name for c in self.cells)
                log.warning(
                    "seed clean-up: could not unregister the seeded cells (%s): %s; their "
                    "databases are kept: `cellsight cells disable` and `cells remove` each",
                    names,
                    exc,
                )
                kept = {c.database_url for c in self.cells}
        registry.engines.dispose()  # no pooled connection holds a file being removed
        registered = {c.database_url for c in self.cells}
        # Made before its cell was registered (interrupted in between: an interrupt
        # probe left a MariaDB database with an empty cell_meta table), its tables are
        # this run's unless another process has registered a cell on it meanwhile.
        now = self._registered_now(registry)
        for url in self.schemas:
            rendered = parse_url(url).render_as_string(hide_password=False)
            if rendered in kept:
                continue  # its cell stays
            if rendered not in registered and (now is None or rendered in now):
                continue  # another run's cell (and so, maybe, its tables), or unknown
            with _logged(f"drop the tables the seed created in {safe_url(url)}"):
                cell_metadata.drop_all(registry.engines.get(url))
        registry.engines.dispose()
        keep_files = {sqlite_file(parse_url(url)) for url in kept}
        for path in self.files:
            if path in keep_files:
                continue
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                with _logged(f"remove {leftover}"):
                    leftover.unlink(missing_ok=True)
        return kept


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # the seed's own error is the one reported
        log.warning("seed clean-up: could not %s: %s", what, exc)
