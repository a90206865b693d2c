"""The purge floor the API applies on both listing paths: the higher of the one recorded
in the index and the one recorded in the API database (``cellsight.indexer.purge``).

The index's is read whenever the API talks to the index (a request's path decision, at
most every ``RECHECK_S``, and each background probe); the API database's at most every
``RECHECK_S`` whatever the index's state, so an API that has never reached the index
(started while it was down) still leaves out what a purge removed. A floor that cannot be
read keeps the last one known; a record that holds no date-time is counted as a bug.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from cellsight.api.driver_errors import API_DB_FAILURES
from cellsight.api.metrics import ApiMetrics
from cellsight.cells.mappings import CellRegistry
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.purge import BadFloor, read_database_floor, read_floor

log = logging.getLogger(__name__)

# How long a floor read is trusted before it is read again (the indexer's writer trusts
# its own copy of the index's as long).
RECHECK_S = 30.0


class _Source:
    def __init__(self) -> None:
        self.floor: datetime | None = None
        self.read_at: float | None = None

    def due(self, force: bool) -> bool:
        return force or self.read_at is None or time.monotonic() - self.read_at >= RECHECK_S


class PurgeFloors:
    def __init__(self, engine: SearchEngine, registry: CellRegistry, metrics: ApiMetrics) -> None:
        self.engine = engine
        self.registry = registry
        self.metrics = metrics
        self._index = _Source()
        self._database = _Source()
        self._lock = threading.Lock()

    def read_index(self, *, force: bool = False) -> None:
        """Refresh the index's floor when due; raises the engine's ``EngineError``."""
        with self._lock:
            if not self._index.due(force):
                return
        try:
            floor = read_floor(self.engine)
        except BadFloor as exc:
            floor = self._bad(self._index, "purge floor", exc)
        self._set(self._index, floor)

    def value(self) -> datetime | None:
        """The floor to apply: the higher of the two known (None: none recorded)."""
        with self._lock:
            due = self._database.due(False)
        if due:
            self._read_database()
        with self._lock:
            known = [f for f in (self._index.floor, self._database.floor) if f is not None]
        return max(known, default=None)

    def _read_database(self) -> None:
        try:
            floor = read_database_floor(self.registry)
        except BadFloor as exc:
            floor = self._bad(self._database, "purge floor in the API database", exc)
        except API_DB_FAILURES as exc:
            # The listing reports the API database's state itself; keep what is known.
            log.warning("purge floor: the API database did not answer (%s)", type(exc).__name__)
            floor = self._database.floor
        self._set(self._database, floor)

    def _bad(self, source: _Source, what: str, exc: Exception) -> datetime | None:
        self.metrics.bug(what, exc, log)
        return source.floor

    def _set(self, source: _Source, floor: datetime | None) -> None:
        with self._lock:
            source.floor, source.read_at = floor, time.monotonic()
