"""What a sync is asked to do, what it reports, and how it fails (``cellsight.indexer.sync``)."""

from __future__ import annotations

import resource as rusage
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

# Seconds before a sync first retries a transient engine failure (``retries``).
RETRY_BACKOFF = 0.5


class SyncFailed(Exception):
    """The sync did not complete; the message says what failed and what was left."""


class SyncInterrupted(SyncFailed):
    """Ctrl-C or SIGTERM; cleaned up like a failure."""


class SyncProgress(Protocol):
    def phase(self, text: str) -> None: ...

    def start_cells(self, cells: Sequence[tuple[str, str, int]]) -> None:
        """(uuid, name, rows expected) of each cell about to be streamed."""

    def advance(self, cell_uuid: str, n: int) -> None: ...


class NoProgress:
    def phase(self, text: str) -> None:
        pass

    def start_cells(self, cells: Sequence[tuple[str, str, int]]) -> None:
        pass

    def advance(self, cell_uuid: str, n: int) -> None:
        pass


@dataclass
class SyncOptions:
    resource: str = "instance"
    cells: Sequence[str] = ()  # names or uuids; empty: every cell, full sync
    workers: int | None = None  # cells loaded at a time; default: by the CPUs
    batch_size: int = 1000
    keep_old: int = 1
    processes: bool | None = None  # workers as processes; None: by the number of rows
    retry_backoff: float = RETRY_BACKOFF  # before the first retry of a transient failure


@dataclass
class SyncReport:
    resource: str
    mode: str
    sync_id: str = field(default_factory=lambda: str(uuidlib.uuid4()))
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished_at: str | None = None
    seconds: float = 0.0
    index: str | None = None
    previous_index: str | None = None
    worker_kind: str = "threads"  # or "processes" (see cellsight.indexer.sync_loader)
    workers: int = 0
    workers_peak_rss_mb: float = 0.0  # the largest worker process's (0: thread workers)
    rows: int = 0
    documents: int = 0
    caught_up: int = 0
    twins: int = 0  # uuids with a row in two cells: indexed once (``Verifier``'s TWIN)
    cleaned_up: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    cells: list[dict[str, Any]] = field(default_factory=list)

    def marker(self, index: str, distribution: str) -> dict[str, Any]:
        """The synced marker (``layout.marker_key``) of this report's completed sync."""
        cells = {
            c["uuid"]: {"name": c["name"], "rows": c["rows_now"], "documents": c["documents"]}
            for c in self.cells
        }
        return {
            "resource": self.resource,
            "index": index,
            "sync_id": self.sync_id,
            "started_at": self.started_at,
            "finished_at": datetime.now(UTC).isoformat(),
            "documents": self.documents,
            "cells": cells,
            "engine": distribution,
        }

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["docs_per_s"] = round(self.rows / self.seconds) if self.seconds else 0
        data["peak_rss_mb"] = {"sync": peak_rss_mb(), "workers": self.workers_peak_rss_mb}
        return data


def peak_rss_mb() -> float:
    """This process's peak resident set since it started, in MiB. ``VmHWM``, not
    ``ru_maxrss``: the latter survives ``execve`` and so starts at the size of whatever
    forked this process."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(rusage.getrusage(rusage.RUSAGE_SELF).ru_maxrss / 1024, 1)
