"""Which instances a purge may have taken out of the index, asked of their cells.

``index purge`` removes the tombstones of instances deleted before its floor, and the
indexer then drops an event older than the floor for an instance without a document,
so that a very late event cannot bring a purged instance back. An instance without a
document whose last change is older than the floor is not always a purged one, though:
a live server nobody changed for longer than ``--older-than`` whose document was never
written (its create arrived late, or it came from ``cells seed --notify``) looks the same
to the index. Its cell tells them apart.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.cells.errors import CellsError
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.schema import instances

log = logging.getLogger(__name__)

CHUNK = 500  # uuids per IN list


def purged_before(registry: CellRegistry, uuids: Sequence[str], floor: datetime) -> set[str]:
    """Of ``uuids``, those a purge at ``floor`` may have removed: deleted before it in
    their cell, without a row there (archived), or mapped to no cell at all.

    A cell that cannot be asked keeps its instances out of the answer: their events are
    written (a purged one so brought back is out of scope for ``index verify --repair``,
    which removes it; a live one dropped would be lost until a repair)."""
    mapped = registry.cells_of(uuids)
    gone = {u for u in uuids if u not in mapped}
    by_cell: dict[str, list[str]] = {}
    for uuid, cell_uuid in mapped.items():
        by_cell.setdefault(cell_uuid, []).append(uuid)
    t = instances.c
    for cell_uuid, members in by_cell.items():
        try:
            engine = registry.cell_engine(cell_uuid)
            kept: set[str] = set()
            with connect(engine) as conn:
                for start in range(0, len(members), CHUNK):
                    chunk = members[start : start + CHUNK]
                    query = sa.select(t.uuid).where(
                        t.uuid.in_(chunk), sa.or_(t.deleted_at.is_(None), t.deleted_at >= floor)
                    )
                    kept.update(conn.execute(query).scalars())
        except (CellsError, sa.exc.SQLAlchemyError) as exc:
            log.warning(
                "cell %s could not be asked whether %d instances were purged (%s): "
                "their events older than the purge floor are written",
                cell_uuid,
                len(members),
                exc,
            )
            continue
        gone.update(u for u in members if u not in kept)
    return gone
