"""The node state cache: every compute node's document, held for a short TTL.

Node queries and the offline status of instances (status 4) read node documents on
every request; there are few nodes (thousands at most) and their state changes slowly
next to request rates, so one load serves every request for ``ttl`` seconds.

* **Refreshed on expiry**: the first request after the TTL loads again; concurrent
  requests wait for that one load rather than each loading (single flight).
* **Invalidated on error**: a failed load drops the cached snapshot and re-raises, so
  no request is answered from state older than one TTL; a partial load (some cell
  did not answer) is returned to its request but not kept, so the next one retries.
* ``invalidate()`` lets writers or tests drop it at once.

Default TTL 5 s: short enough that a node marked offline shows as such within a few
seconds, long enough that a burst of queries costs one load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from api.fanout import SkippedCell

DEFAULT_TTL = 5.0


@dataclass(frozen=True)
class NodeSnapshot:
    """The node documents of one load, where they came from, and what was missing."""

    documents: tuple[Mapping[str, Any], ...]
    source: str  # "index" or "cells"
    skipped_cells: tuple[SkippedCell, ...] = ()
    loaded_at: float = 0.0
    _offline: frozenset[tuple[str, str]] = field(default=frozenset(), repr=False)

    @classmethod
    def of(
        cls,
        documents: Sequence[Mapping[str, Any]],
        source: str,
        skipped_cells: tuple[SkippedCell, ...] = (),
        loaded_at: float = 0.0,
    ) -> NodeSnapshot:
        offline = frozenset(
            (str(d.get("host")), str(d.get("hypervisor_hostname")))
            for d in documents
            if d.get("offline")
        )
        return cls(tuple(documents), source, skipped_cells, loaded_at, offline)

    @property
    def complete(self) -> bool:
        return not self.skipped_cells

    def is_offline(self, host: str | None, node: str | None) -> bool:
        """Whether the node an instance runs on is offline (unknown nodes are not)."""
        if host is None:
            return False
        if node is not None:
            return (host, node) in self._offline
        # An instance without a node name: its host counts as offline if any node is.
        return any(h == host for h, _ in self._offline)


Loader = Callable[[], NodeSnapshot]


class NodeCache:
    def __init__(
        self,
        loader: Loader,
        *,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 0:
            raise ValueError("ttl must not be negative")
        self._loader = loader
        self.ttl = ttl
        self._clock = clock
        self._snapshot: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self.loads = 0  # how many loads ran: observability and tests

    def get(self) -> NodeSnapshot:
        snapshot = self._snapshot
        if snapshot is not None and self._fresh(snapshot):
            return snapshot
        with self._lock:
            # Another thread may have loaded while this one waited for the lock.
            snapshot = self._snapshot
            if snapshot is not None and self._fresh(snapshot):
                return snapshot
            self._snapshot = None
            self.loads += 1
            loaded = self._loader()  # an exception leaves the cache empty
            loaded = NodeSnapshot.of(
                list(loaded.documents), loaded.source, loaded.skipped_cells, self._clock()
            )
            if loaded.complete:
                self._snapshot = loaded
            return loaded

    def invalidate(self) -> None:
        self._snapshot = None

    def _fresh(self, snapshot: NodeSnapshot) -> bool:
        return self._clock() - snapshot.loaded_at < self.ttl
