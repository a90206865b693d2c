"""Tombstone retention: remove old deleted documents, keep a floor against resurrection.

A purge holds the instance maintenance lock (``cellsight.indexer.lock``), as a sync and a
verify do: it never runs beside them (a sync's scope and a repair read the floor it
moves, and a sync swaps the index it deletes from).

The floor is recorded in the index, which the writer and the index path read, and in the
API database, which the fan-out path reads without the index; the API applies the higher
of the two on both paths."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.lock import TTL, MaintenanceLock
from cellsight.indexer.retries import retrying

if TYPE_CHECKING:
    from cellsight.cells.mappings import CellRegistry

PURGE_FLOOR_KEY = "purge_floor:instance"


class BadFloor(ValueError):
    """The recorded purge floor is not a date-time (a hand-edited meta record)."""


def read_floor(engine: SearchEngine) -> datetime | None:
    """The recorded purge floor (aware), or None; raises the engine's ``EngineError``, or
    ``BadFloor`` for a record that does not hold one."""
    return _floor_of(engine.get_meta(PURGE_FLOOR_KEY))


def read_database_floor(registry: CellRegistry) -> datetime | None:
    """The purge floor recorded in the API database; raises ``DatabaseUnavailable`` or
    ``BadFloor`` as ``read_floor`` does."""
    try:
        meta = registry.get_meta(PURGE_FLOOR_KEY)
    except ValueError as exc:
        raise BadFloor(f"{PURGE_FLOOR_KEY} in the API database is not JSON: {exc}") from exc
    return _floor_of(meta)


def current_floor(engine: SearchEngine, registry: CellRegistry) -> datetime | None:
    """The higher of the floors recorded in the index and in the API database (an engine
    that came back empty has lost its own)."""
    recorded = [read_floor(engine), read_database_floor(registry)]
    return max((f for f in recorded if f is not None), default=None)


def raise_floor(
    engine: SearchEngine, registry: CellRegistry | None, at_least: datetime | None = None
) -> datetime | None:
    """Both records (the index's, and ``registry``'s API database's when given) brought to
    the highest of themselves and ``at_least``, which is returned (None: none at all).
    The API database first: a fan-out that knows the floor before the index does only
    leaves out what is about to go."""
    in_index = read_floor(engine)
    in_database = read_database_floor(registry) if registry is not None else None
    floor = max((f for f in (at_least, in_index, in_database) if f is not None), default=None)
    if floor is None:
        return None
    record = {"before": floor.isoformat()}
    if registry is not None and in_database != floor:
        registry.put_meta(PURGE_FLOOR_KEY, record)
    if in_index != floor:
        engine.put_meta(PURGE_FLOOR_KEY, record)
    return floor


def _floor_of(meta: Any) -> datetime | None:
    if meta is None:
        return None
    if not isinstance(meta, Mapping):
        raise BadFloor(f"{PURGE_FLOOR_KEY} holds no date-time: {meta!r:.200}")
    if not meta:
        return None
    try:
        floor = datetime.fromisoformat(meta["before"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadFloor(f"{PURGE_FLOOR_KEY} holds no date-time: {meta!r:.200}") from exc
    return floor if floor.tzinfo is not None else floor.replace(tzinfo=UTC)


def purge_tombstones(
    engine: SearchEngine,
    deleted_before: datetime,
    chunk: int = 1000,
    *,
    registry: CellRegistry | None = None,
    lock_ttl: float = TTL,
) -> int:
    """Delete instance tombstones whose ``deleted_at`` is before the floor: ``deleted_before``,
    or a higher floor an earlier purge recorded in the index or in ``registry``'s API
    database (below it nothing is listed on either path and a full sync rebuilds nothing,
    so a tombstone written there late is removed too). The floor is recorded in both.

    Holds the instance maintenance lock throughout: raises ``LockHeld`` (nothing done)
    when a sync, verify or purge holds it, and ``LockLost`` between chunks when another
    took it over (what was deleted stays deleted: the floor was recorded first).

    The floor is recorded *before* anything is deleted: from then on the writer drops an
    event whose snapshot is older than the floor when its instance has no document, so a
    very late stale event cannot recreate a purged instance, while live instances (whose
    documents exist) keep their normal versioned writes.
    """
    with MaintenanceLock(engine, "instance", "purge", ttl=lock_ttl) as lock:
        # Before any sync there is nothing to purge, not "alias does not exist" (exit 1).
        retrying(partial(engine.ensure_ready, "instance"), "instance purge: making it ready")
        floor = raise_floor(engine, registry, deleted_before) or deleted_before
        removed = 0
        tombstones = engine.iter_tombstones("instance", floor)
        while ids := list(islice(tombstones, chunk)):
            lock.check()
            removed += engine.delete("instance", ids)
        return removed
