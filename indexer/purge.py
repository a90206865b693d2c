"""Tombstone retention: remove old deleted documents, keep a floor against resurrection."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

from cellsight.indexer.engines.base import SearchEngine

PURGE_FLOOR_KEY = "purge_floor:instance"


class BadFloor(ValueError):
    """The recorded purge floor is not a date-time (a hand-edited meta record)."""


def read_floor(engine: SearchEngine) -> datetime | None:
    """The recorded purge floor (aware), or None; raises the engine's ``EngineError``, or
    ``BadFloor`` for a record that does not hold one."""
    meta = engine.get_meta(PURGE_FLOOR_KEY)
    if not meta:
        return None
    try:
        floor = datetime.fromisoformat(meta["before"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadFloor(f"{PURGE_FLOOR_KEY} holds no date-time: {meta!r:.200}") from exc
    return floor if floor.tzinfo is not None else floor.replace(tzinfo=UTC)


def purge_tombstones(engine: SearchEngine, deleted_before: datetime, chunk: int = 1000) -> int:
    """Delete instance tombstones whose ``deleted_at`` is before the floor: ``deleted_before``,
    or a higher floor an earlier purge recorded (below it nothing is listed on either path
    and a full sync rebuilds nothing, so a tombstone written there late is removed too).

    The floor is recorded *before* anything is deleted: from then on the writer drops an
    event whose snapshot is older than the floor when its instance has no document, so a
    very late stale event cannot recreate a purged instance, while live instances (whose
    documents exist) keep their normal versioned writes.
    """
    current = read_floor(engine)
    floor = deleted_before
    if current and current > floor:
        floor = current
    engine.put_meta(PURGE_FLOOR_KEY, {"before": floor.isoformat()})
    removed = 0
    tombstones = engine.iter_tombstones("instance", floor)
    while ids := list(islice(tombstones, chunk)):
        removed += engine.delete("instance", ids)
    return removed
