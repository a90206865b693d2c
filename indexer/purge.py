"""Tombstone retention: remove old deleted documents, keep a floor against resurrection."""

from __future__ import annotations

from datetime import datetime
from itertools import islice

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.writer import PURGE_FLOOR_KEY


def purge_tombstones(engine: SearchEngine, deleted_before: datetime, chunk: int = 1000) -> int:
    """Delete instance tombstones whose ``deleted_at`` is before ``deleted_before``.

    The floor is recorded *before* anything is deleted: from then on the writer drops an
    event whose snapshot is older than the floor when its instance has no document, so a
    very late stale event cannot recreate a purged instance, while live instances (whose
    documents exist) keep their normal versioned writes.
    """
    current = engine.get_meta(PURGE_FLOOR_KEY)
    floor = deleted_before
    if current and datetime.fromisoformat(current["before"]) > floor:
        floor = datetime.fromisoformat(current["before"])
    engine.put_meta(PURGE_FLOOR_KEY, {"before": floor.isoformat()})
    removed = 0
    tombstones = engine.iter_tombstones("instance", deleted_before)
    while ids := list(islice(tombstones, chunk)):
        removed += engine.delete("instance", ids)
    return removed
