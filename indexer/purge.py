"""Tombstone retention: remove old deleted documents, keep a floor against resurrection.

A purge holds the instance maintenance lock (``cellsight.indexer.lock``), as a sync and a
verify do: it never runs beside them (a sync's scope and a repair read the floor it
moves, and a sync swaps the index it deletes from)."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.lock import TTL, MaintenanceLock

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


def purge_tombstones(
    engine: SearchEngine, deleted_before: datetime, chunk: int = 1000, *, lock_ttl: float = TTL
) -> int:
    """Delete instance tombstones whose ``deleted_at`` is before the floor: ``deleted_before``,
    or a higher floor an earlier purge recorded (below it nothing is listed on either path
    and a full sync rebuilds nothing, so a tombstone written there late is removed too).

    Holds the instance maintenance lock throughout: raises ``LockHeld`` (nothing done)
    when a sync, verify or purge holds it, and ``LockLost`` between chunks when another
    took it over (what was deleted stays deleted: the floor was recorded first).

    The floor is recorded *before* anything is deleted: from then on the writer drops an
    event whose snapshot is older than the floor when its instance has no document, so a
    very late stale event cannot recreate a purged instance, while live instances (whose
    documents exist) keep their normal versioned writes.
    """
    with MaintenanceLock(engine, "instance", "purge", ttl=lock_ttl) as lock:
        current = read_floor(engine)
        floor = deleted_before
        if current and current > floor:
            floor = current
        engine.put_meta(PURGE_FLOOR_KEY, {"before": floor.isoformat()})
        removed = 0
        tombstones = engine.iter_tombstones("instance", floor)
        while ids := list(islice(tombstones, chunk)):
            lock.check()
            removed += engine.delete("instance", ids)
        return removed
