"""One batch of notifications → one versioned bulk write → a verdict per message.

The consumer acks a message only after this returns its verdict: INDEXED and STALE
(the newer state is already stored) and IGNORED are acked; DEAD is dead-lettered with
its reason, then acked. Transient failures (the engine's, and the API database's for
the cell lookup) are retried here, with exponential backoff and jitter, for as long as
it takes or until shutdown; the batch is then left unacked so a restart redelivers it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_random_exponential,
)

from cellsight.cells.errors import DatabaseUnavailable
from cellsight.indexer import metrics, retag
from cellsight.indexer.engines.base import (
    EngineTimeout,
    EngineUnavailable,
    IndexMissing,
    SearchEngine,
    WriteOp,
    WriteStatus,
)
from cellsight.indexer.outcomes import Outcome, Verdict, dead
from cellsight.indexer.planning import Planned, plan
from cellsight.indexer.purge import read_floor
from cellsight.indexer.retag import carries_tags, merge_tags, newest_carrying_tags, retag_ops
from cellsight.indexer.retries import ItemsToRetry, warn_before_retry

__all__ = [
    "BatchWriter",
    "Outcome",
    "Planned",
    "Verdict",
    "dead",
    "merge_tags",
    "plan",
    "record_outcomes",
]

log = logging.getLogger(__name__)

TAGS_VERSION = ("tags_version",)


class CellLookup(Protocol):
    """What the writer asks of the cells (``CellRegistry`` and ``cells.purged``)."""

    def cells_of(self, instance_uuids: Sequence[str]) -> dict[str, str]:
        """Instance uuid → cell uuid, for Nova's own payloads (no cell in them)."""

    def purged_before(self, instance_uuids: Sequence[str], floor: datetime) -> set[str]:
        """Those a purge at ``floor`` may have removed from the index."""


# What a commit waits out, unacked: the engine's outages, and the API database's, which
# the cell lookup of Nova's own payloads reads (an indexer that stopped for it would
# index nothing until restarted, where one that waits resumes on its own).
TRANSIENT = (EngineUnavailable, DatabaseUnavailable)
# An engine that comes back empty (an in-memory peer restarted, a wiped cluster) gets its
# indexes made again as at start-up, which is what a restart would do; an index missing
# again this many times over one batch is something else, and stops the indexer.
RECREATIONS = 3
# Seconds at least between a request that timed out and its retry: an engine too busy to
# answer in time is not asked again at once (a probe: with writes in flight, each one sent
# again at once kept a busy peer past the timeout; the jitter alone often waited 0.0 s).
TIMEOUT_PAUSE = 1.0


def retry_wait(max_backoff: float) -> Callable[[RetryCallState], float]:
    """Jittered exponential backoff from 0.1 s up to ``max_backoff``; after a timeout,
    ``TIMEOUT_PAUSE`` at least (``max_backoff`` at most)."""
    jittered = wait_random_exponential(multiplier=0.1, max=max_backoff)

    def wait(state: RetryCallState) -> float:
        pause = float(jittered(state))
        failed = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failed, EngineTimeout):
            return max(pause, min(TIMEOUT_PAUSE, max_backoff))
        return pause

    return wait


class BatchWriter:
    def __init__(
        self,
        engine: SearchEngine,
        *,
        stop: threading.Event | None = None,
        cell_resolver: CellLookup | None = None,
        max_backoff: float = 30.0,
        floor_ttl: float = 30.0,
        record_metrics: bool = True,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        # A writer process leaves the metrics to its consumer, which records them from
        # the verdicts and the retries it is told of (this process's registry is unseen).
        self.record_metrics = record_metrics
        self.on_retry = on_retry or metrics.RETRIES.inc
        self.stop = stop or threading.Event()
        self.cell_resolver = cell_resolver
        self.max_backoff = max_backoff
        self.floor_ttl = floor_ttl
        self._floor: tuple[float, datetime | None] = (0.0, None)
        self._ready: set[str] = set()
        self._making_ready = threading.Lock()
        self._wait = retry_wait(max_backoff)

    def purge_floor(self) -> datetime | None:
        fetched_at, floor = self._floor
        if time.monotonic() - fetched_at > self.floor_ttl:
            floor = read_floor(self.engine)
            self._floor = (time.monotonic(), floor)
        return floor

    def write(self, bodies: Sequence[Any]) -> list[Outcome]:
        return self.commit(*self.plan(bodies))

    def plan(self, bodies: Sequence[Any]) -> tuple[list[Outcome | None], list[Planned]]:
        """Decode and map (CPU only): the consumer runs this while earlier batches are
        being written, then hands the result to ``commit``."""
        return plan(bodies)

    def commit(self, outcomes: list[Outcome | None], planned: list[Planned]) -> list[Outcome]:
        """Engine reads and the versioned bulk write of a planned batch: a verdict each."""
        if planned:
            for recreated in range(RECREATIONS + 1):
                try:
                    self._commit(outcomes, planned)
                    break
                except IndexMissing as exc:
                    if recreated == RECREATIONS:
                        raise
                    # Writes are versioned: what this batch wrote before is written again
                    # harmlessly, and what the engine lost is for `index sync` to restore.
                    log.warning(
                        "the engine has lost its indexes (%s): making them again as at "
                        "start-up; `cellsight index sync --type instance` and `--type "
                        "node` restore what they held",
                        exc,
                    )
                    self._ready.clear()
        final = [o if o is not None else dead("internal", "no verdict") for o in outcomes]
        if self.record_metrics:
            record_outcomes(final)
        return final

    def _commit(self, outcomes: list[Outcome | None], planned: list[Planned]) -> None:
        resources = {p.op.resource for p in planned}
        self._retrying(lambda: self._ensure_ready(resources), "making the indexes ready")
        self._retrying(lambda: self._prepare(planned, outcomes), "reading stored tags")
        todo = [p for p in planned if outcomes[p.position] is None]
        stale: list[tuple[WriteOp, int | None]] = []
        if todo:
            self._retrying(lambda: self._write(todo, outcomes, stale), "the bulk write")
        if stale:
            newest = newest_carrying_tags(op for op, _ in stale)
            # The embedded engine says which stored tags are older; the others: read.
            known = all(tags is not None for _, tags in stale)
            self._retrying(lambda: self._retag(newest, known), "rewriting stale events' tags")

    def _ensure_ready(self, resources: set[str]) -> None:
        # Node notifications may be the first a fresh index sees of its node alias.
        if resources <= self._ready:
            return
        # One commit at a time makes them: after a wipe, the commits in flight each made
        # their own, all but the oldest were dropped, and a bulk already under way to one
        # dropped made the engine create it again, unaliased (a probe).
        with self._making_ready:
            for resource in sorted(resources - self._ready):
                self.engine.ensure_ready(resource)
                self._ready.add(resource)

    def _retrying(self, fn: Callable[[], None], what: str) -> None:
        for attempt in Retrying(
            retry=retry_if_exception_type(TRANSIENT),
            wait=self._wait,
            stop=stop_when_event_set(self.stop),
            before_sleep=warn_before_retry(log, what),
            reraise=True,
        ):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self.on_retry()
                    if self.record_metrics:
                        metrics.ENGINE_UP.set(0)  # until this write goes through
                fn()
        if self.record_metrics:
            metrics.ENGINE_UP.set(1)

    def _prepare(self, planned: Sequence[Planned], outcomes: list[Outcome | None]) -> None:
        """Tags merge, the purge floor and the cell of Nova's own payloads."""
        instances = [p for p in planned if p.op.resource == "instance"]
        floor = self.purge_floor()
        below_floor = [p for p in instances if floor and p.snapshot_at and p.snapshot_at < floor]
        lookup = {p.op.id for p in instances if "tags" not in p.op.document}
        lookup |= {p.op.id for p in below_floor}
        stored = (
            self.engine.get_many("instance", sorted(lookup), fields=("tags", "tags_version"))
            if lookup
            else {}
        )
        unknown = sorted({p.op.id for p in below_floor if p.op.id not in stored})
        # A very late event must not recreate a purged instance; without a document and
        # older than the floor, a live one looks the same here: its cell tells.
        gone = set(unknown)
        if unknown and floor is not None and self.cell_resolver is not None:
            gone = self.cell_resolver.purged_before(unknown, floor)
        for p in below_floor:
            if p.op.id in gone:
                outcomes[p.position] = Outcome(
                    Verdict.STALE,
                    "below_purge_floor",
                    event_type=p.notification.event_type,
                    resource=p.op.resource,
                )
        merge_tags(instances, stored)
        missing_cell = [p for p in instances if not p.op.document.get("cell_uuid")]
        if missing_cell and self.cell_resolver is not None:
            cells = self.cell_resolver.cells_of(sorted({p.op.id for p in missing_cell}))
            for p in missing_cell:
                p.op.document["cell_uuid"] = cells.get(p.op.id)

    def _write(
        self,
        todo: list[Planned],
        outcomes: list[Outcome | None],
        stale: list[tuple[WriteOp, int | None]],
    ) -> None:
        """The bulk write; ``stale`` gets the stale ops that carried their own tags and
        may be newer than the stored ones, with the stored tags version if known."""
        pending = [p for p in todo if outcomes[p.position] is None]
        if not pending:
            return
        results = self.engine.bulk([p.op for p in pending])
        now = datetime.now(UTC)
        retry = 0
        for p, result in zip(pending, results, strict=True):
            event_type = p.notification.event_type
            if result.status is WriteStatus.OK:
                stamp = p.notification.timestamp
                outcomes[p.position] = Outcome(
                    Verdict.INDEXED,
                    event_type=event_type,
                    resource=p.op.resource,
                    lag=None if stamp is None else max(0.0, (now - stamp).total_seconds()),
                )
            elif result.status is WriteStatus.STALE:
                outcomes[p.position] = Outcome(
                    Verdict.STALE, "stale", event_type=event_type, resource=p.op.resource
                )
                known = result.tags_version
                if carries_tags(p.op) and (known is None or known < p.op.version):
                    stale.append((p.op, known))
            elif result.status is WriteStatus.REJECTED:
                outcomes[p.position] = dead(
                    "rejected", f"engine rejected document: {result.reason}", event_type
                )
            else:
                retry += 1
        if retry:
            raise ItemsToRetry(f"{retry} of {len(pending)} items must be retried")

    def _retag(self, pending: dict[str, WriteOp], known: bool) -> None:
        """Stale events' tags newer than the stored ones replace them (``retag``).
        ``known``: the stored tags were found older (no need to read their version)."""
        for _ in range(retag.ATTEMPTS):
            if not known:
                light = self.engine.get_many("instance", sorted(pending), fields=TAGS_VERSION)
                pending = {i: op for i, op in pending.items() if retag.needed(op, light.get(i))}
                if not pending:
                    return
            known = False
            ops = retag_ops(pending, self.engine.get_many("instance", sorted(pending)))
            if not ops:
                return
            lost: dict[str, WriteOp] = {}
            retry = 0
            for op, result in zip(ops, self.engine.bulk(ops), strict=True):
                if result.status is WriteStatus.REJECTED:
                    log.warning("instance %s: its tags were refused: %s", op.id, result.reason)
                elif result.status is WriteStatus.RETRY:
                    retry += 1
                elif result.status is WriteStatus.STALE:
                    lost[op.id] = pending[op.id]  # another write came in between: look again
            if retry:
                raise ItemsToRetry(f"{retry} of {len(ops)} tag rewrites must be retried")
            if not lost:
                return
            pending = lost
        log.warning("tags of %d instances not replaced: newer versions kept arriving", len(pending))


def record_outcomes(outcomes: Iterable[Outcome]) -> None:
    """The indexer's per-message metrics, from the verdicts alone (wherever they were
    reached: this process's writer threads or a writer process). Counted per label
    first: a labelled counter's lookup and lock cost more than the count."""
    counts: Counter[tuple[Verdict, str]] = Counter()
    lags: list[float] = []
    consumed = 0
    for o in outcomes:
        consumed += 1
        if o.verdict is Verdict.INDEXED:
            counts[Verdict.INDEXED, o.resource or ""] += 1
            if o.lag is not None:
                lags.append(o.lag)
        elif o.verdict is Verdict.STALE:
            if o.resource is not None:
                counts[Verdict.STALE, o.resource] += 1
        elif o.verdict is Verdict.DEAD:
            counts[Verdict.DEAD, o.reason_code or "unknown"] += 1
            log.warning("dead-lettering %s: %s", o.event_type or "message", o.reason)
        else:
            counts[Verdict.IGNORED, metrics.ignored_label(o.event_type or "")] += 1
    if consumed:
        metrics.CONSUMED.inc(consumed)
    for (verdict, label), n in counts.items():
        BY_VERDICT[verdict].labels(label).inc(n)
    for lag in lags:
        metrics.LAG_SECONDS.observe(lag)


BY_VERDICT = {
    Verdict.INDEXED: metrics.INDEXED,
    Verdict.STALE: metrics.STALE,
    Verdict.DEAD: metrics.DEAD_LETTERED,
    Verdict.IGNORED: metrics.IGNORED,
}
