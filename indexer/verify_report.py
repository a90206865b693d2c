"""What ``index verify`` finds: the kinds of drift, the merge-join that finds them, and
the per-cell and per-run reports (see :mod:`cellsight.indexer.verify`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from cellsight.indexer.engines.base import WriteOp, WriteResult, WriteStatus

MISSING, STALE, ORPHANED, AHEAD = "missing", "stale", "orphaned", "ahead"
MISFILED = "misfiled"
HIDDEN = "hidden"  # a live row under a tombstone of a higher version (a restored cell)
TWIN = "twin"  # a row in this cell and one in another: one document, under the other
SAMPLES = 5
RECREATION_REFUSED = (
    "recreation refused below a newer deletion the engine keeps (index.gc_deletes, 60 s "
    "by default); the next verify writes it"
)


class VerifyInterrupted(KeyboardInterrupt):
    """An interrupted ``verify --repair``, saying what it repaired before it stopped (a
    sync probe: a bare "interrupted" said the same for none and for nearly all)."""

    def __init__(self, resource: str, repaired: int) -> None:
        super().__init__(f"{resource} verify interrupted: {repaired:,} repaired before it stopped")


class VerifyStopped(Exception):
    """The run was interrupted, or its lock lost, while this cell was compared."""

    def __init__(self, cell: str) -> None:
        super().__init__(f"{cell} stopped before its end: the run was interrupted or lost its lock")


def brief(exc: BaseException) -> str:
    """One line of an error for a report: a database error in the driver's own words
    (SQLAlchemy's add the statement and its parameters)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no detail'}"


def diff(
    rows: Iterator[tuple[str, int]], docs: Iterator[tuple[str, int]]
) -> Iterator[tuple[str, str, int]]:
    """``(kind, uuid, version)`` of every difference between two uuid-ordered streams;
    the version is the row's (missing, stale, ahead) or the document's (orphaned)."""
    row, doc = next(rows, None), next(docs, None)
    while row is not None or doc is not None:
        if doc is None or (row is not None and row[0] < doc[0]):
            yield MISSING, row[0], row[1]  # type: ignore[index]
            row = next(rows, None)
        elif row is None or doc[0] < row[0]:
            yield ORPHANED, doc[0], doc[1]
            doc = next(docs, None)
        else:
            if doc[1] < row[1]:
                yield STALE, row[0], row[1]
            elif doc[1] > row[1]:
                yield AHEAD, row[0], row[1]
            row, doc = next(rows, None), next(docs, None)


def counted(stream: Iterator[tuple[str, int]], counter: list[int]) -> Iterator[tuple[str, int]]:
    for item in stream:
        counter[0] += 1
        yield item


@dataclass
class CellDrift:
    uuid: str
    name: str
    rows: int = 0
    documents: int = 0
    missing: int = 0
    stale: int = 0
    orphaned: int = 0
    ahead: int = 0
    misfiled: int = 0
    misfiled_held: int = 0  # misfiled at or above its row's revision: not rewritten
    row_elsewhere: int = 0  # filed here, its row in another cell: not an orphan
    hidden: int = 0
    node_ahead: int = 0  # a node document still ahead when its row is read again: drift
    twin: int = 0  # its row here and in another cell, its document filed there: not drift
    tombstones_without_row: int = 0
    repaired: int = 0
    repair_lost_to_newer: int = 0  # a live write got there first: nothing to do
    repair_refused: int = 0  # see _write: a deleted document's version still remembered
    repair_failed: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # Why the comparison stopped (its counts are then partial, rows and documents 0);
    # also the last of ``errors``. None: the cell was compared to its end.
    failed: str | None = None

    @property
    def drift(self) -> int:
        return (
            self.missing + self.stale + self.orphaned + self.misfiled + self.hidden
            + self.node_ahead
        )  # fmt: skip

    def note(self, kind: str, uuid: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        sample = self.samples.setdefault(kind, [])
        if len(sample) < SAMPLES:
            sample.append(uuid)

    def tally(self, written: list[tuple[WriteOp, WriteResult]], missing: set[str]) -> list[str]:
        """Counts a repair's results; returns the ids of documents that were ``missing``
        and answered STALE (a recreation refused, or a live write that made them)."""
        refused: list[str] = []
        busy = 0
        for op, result in written:
            if result.status is WriteStatus.OK:
                self.repaired += 1
            elif result.status is WriteStatus.STALE and op.id in missing:
                refused.append(op.id)
            elif result.status is WriteStatus.STALE:
                self.repair_lost_to_newer += 1
            elif result.status is WriteStatus.RETRY:
                busy += 1
            else:
                self.repair_failed += 1
                if len(self.errors) < SAMPLES:
                    self.errors.append(f"{op.id}: {result.reason}")
        self.repair_failed += busy
        if busy:
            self.errors.append(f"{busy} repairs not written: engine busy")
        return refused


@dataclass
class VerifyReport:
    resource: str
    target: str  # the read alias, or the concrete index a sync checks
    repair: bool
    started_at: str
    seconds: float = 0.0
    cells: list[CellDrift] = field(default_factory=list)
    unattributed: int | None = None  # documents of no registered cell (never repaired)

    @property
    def drift(self) -> int:
        return sum(c.drift for c in self.cells)

    @property
    def ok(self) -> bool:
        return not any(c.errors for c in self.cells)

    @property
    def failed_cells(self) -> list[CellDrift]:
        """The cells whose comparison did not finish."""
        return [c for c in self.cells if c.failed is not None]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["drift"] = self.drift
        for cell, data in zip(self.cells, out["cells"], strict=True):
            data["drift"] = cell.drift
        return out


def unrepaired(drift: CellDrift, resource: str, held: bool) -> list[str]:
    """What a repair of ``drift`` left as it was, and why, one line each."""
    said = []
    if drift.hidden:
        said.append(
            f"{drift.hidden:,} live rows under a tombstone of a higher version (a restored "
            "database?): not rewritten (index sync rebuilds them)"
        )
    if drift.misfiled_held:
        said.append(
            f"{drift.misfiled_held:,} documents filed under another cell hold a version "
            "at or above their row's revision: not rewritten (index sync rebuilds them)"
        )
    if held and drift.orphaned:
        said.append(
            f"the cell holds no {resource} rows while the index holds "
            f"{drift.documents:,} documents for it: its orphans were not repaired "
            "(check the cell's database URL)"
        )
    return said
