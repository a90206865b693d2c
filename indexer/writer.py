"""One batch of notifications → one versioned bulk write → a verdict per message.

The consumer acks a message only after this returns its verdict: INDEXED and STALE
(the newer state is already stored) and IGNORED are acked; DEAD is dead-lettered with
its reason, then acked. Transient engine failures are retried here, with exponential
backoff and jitter, for as long as it takes or until shutdown; the batch is then left
unacked so a restart redelivers it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_when_event_set,
    wait_random_exponential,
)

from indexer import metrics
from indexer.documents import (
    event_version,
    instance_document,
    node_document,
    node_version,
    snapshot_time,
)
from indexer.engines.base import (
    EngineUnavailable,
    SearchEngine,
    StoredDocument,
    WriteOp,
    WriteStatus,
)
from notifications.envelope import Notification, decode
from notifications.errors import NotificationError
from notifications.objects import ComputeNodePayload
from notifications.payloads import InstancePayload

log = logging.getLogger(__name__)

CellResolver = Callable[[Sequence[str]], dict[str, str]]
PURGE_FLOOR_KEY = "purge_floor:instance"


class Verdict(StrEnum):
    INDEXED = "indexed"
    STALE = "stale"
    IGNORED = "ignored"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason_code: str | None = None
    reason: str | None = None
    event_type: str | None = None


@dataclass
class Planned:
    position: int
    op: WriteOp
    notification: Notification
    snapshot_at: datetime | None


class ItemsToRetry(EngineUnavailable):
    """Some items got 429/5xx: write those again after a backoff."""


def dead(code: str, reason: str, event_type: str | None = None) -> Outcome:
    return Outcome(Verdict.DEAD, code, reason, event_type)


def plan(bodies: Sequence[Any]) -> tuple[list[Outcome | None], list[Planned]]:
    """Decode and map a batch. Pure: no engine, no bus. Unplanned positions are final."""
    outcomes: list[Outcome | None] = [None] * len(bodies)
    planned: list[Planned] = []
    for i, body in enumerate(bodies):
        try:
            n = decode(body)
        except NotificationError as exc:
            outcomes[i] = dead(exc.reason, f"{type(exc).__name__}: {exc.message}")
            continue
        payload, event = n.payload, n.event
        if isinstance(payload, ComputeNodePayload):
            version = node_version(payload)
            op = WriteOp("node", payload.uuid, version, node_document(payload, version))
            planned.append(Planned(i, op, n, payload.updated_at))
        elif event.object == "instance":
            if not isinstance(payload, InstancePayload):
                outcomes[i] = dead(
                    "not_an_instance",
                    f"{n.event_type}: payload {payload.obj_name} {payload.obj_version} "
                    "does not carry the InstancePayload fields",
                    n.event_type,
                )
                continue
            version = event_version(payload, event, n.timestamp)
            doc = instance_document(payload, n.event_type, version)
            planned.append(
                Planned(
                    i, WriteOp("instance", payload.uuid, version, doc), n, snapshot_time(payload)
                )
            )
        else:
            outcomes[i] = Outcome(Verdict.IGNORED, event_type=n.event_type)
    return outcomes, planned


def merge_tags(planned: Sequence[Planned], stored: dict[str, StoredDocument]) -> None:
    """Give documents built from tag-less payloads the newest tags known below them."""
    sources: dict[str, list[tuple[int, list[str]]]] = {}
    for doc_id, s in stored.items():
        if isinstance(s.document.get("tags"), list):
            sources.setdefault(doc_id, []).append((s.version, s.document["tags"]))
    for p in planned:
        if "tags" in p.op.document:
            sources.setdefault(p.op.id, []).append((p.op.version, p.op.document["tags"]))
    for p in planned:
        if p.op.resource != "instance" or "tags" in p.op.document:
            continue
        known = sorted(sources.get(p.op.id, []), key=lambda vt: vt[0])
        below = [tags for version, tags in known if version < p.op.version]
        p.op.document["tags"] = list(below[-1] if below else known[-1][1] if known else [])


class BatchWriter:
    def __init__(
        self,
        engine: SearchEngine,
        *,
        stop: threading.Event | None = None,
        cell_resolver: CellResolver | None = None,
        max_backoff: float = 30.0,
        floor_ttl: float = 30.0,
    ) -> None:
        self.engine = engine
        self.stop = stop or threading.Event()
        self.cell_resolver = cell_resolver
        self.max_backoff = max_backoff
        self.floor_ttl = floor_ttl
        self._floor: tuple[float, datetime | None] = (0.0, None)

    def purge_floor(self) -> datetime | None:
        fetched_at, floor = self._floor
        if time.monotonic() - fetched_at > self.floor_ttl:
            meta = self.engine.get_meta(PURGE_FLOOR_KEY)
            floor = datetime.fromisoformat(meta["before"]) if meta else None
            self._floor = (time.monotonic(), floor)
        return floor

    def write(self, bodies: Sequence[Any]) -> list[Outcome]:
        outcomes, planned = plan(bodies)
        if planned:
            self._retrying(lambda: self._prepare(planned, outcomes))
            todo = [p for p in planned if outcomes[p.position] is None]
            if todo:
                self._retrying(lambda: self._write(todo, outcomes))
        final = [o if o is not None else dead("internal", "no verdict") for o in outcomes]
        self._count(final)
        return final

    def _retrying(self, fn: Callable[[], None]) -> None:
        for attempt in Retrying(
            retry=retry_if_exception_type(EngineUnavailable),
            wait=wait_random_exponential(multiplier=0.1, max=self.max_backoff),
            stop=stop_when_event_set(self.stop),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        ):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    metrics.RETRIES.inc()
                fn()
        metrics.ENGINE_UP.set(1)

    def _prepare(self, planned: Sequence[Planned], outcomes: list[Outcome | None]) -> None:
        """Tags merge, the purge floor and the cell of Nova's own payloads."""
        instances = [p for p in planned if p.op.resource == "instance"]
        floor = self.purge_floor()
        below_floor = [p for p in instances if floor and p.snapshot_at and p.snapshot_at < floor]
        lookup = {p.op.id for p in instances if "tags" not in p.op.document}
        lookup |= {p.op.id for p in below_floor}
        stored = self.engine.get_many("instance", sorted(lookup)) if lookup else {}
        for p in below_floor:
            if p.op.id not in stored:
                # Its tombstone was purged: a very late event must not recreate it.
                metrics.STALE.labels(p.op.resource).inc()
                outcomes[p.position] = Outcome(
                    Verdict.STALE, "below_purge_floor", event_type=p.notification.event_type
                )
        merge_tags(instances, stored)
        missing_cell = [p for p in instances if not p.op.document.get("cell_uuid")]
        if missing_cell and self.cell_resolver is not None:
            cells = self.cell_resolver(sorted({p.op.id for p in missing_cell}))
            for p in missing_cell:
                p.op.document["cell_uuid"] = cells.get(p.op.id)

    def _write(self, todo: list[Planned], outcomes: list[Outcome | None]) -> None:
        pending = [p for p in todo if outcomes[p.position] is None]
        if not pending:
            return
        results = self.engine.bulk([p.op for p in pending])
        now = datetime.now(UTC)
        retry = 0
        for p, result in zip(pending, results, strict=True):
            event_type = p.notification.event_type
            if result.status is WriteStatus.OK:
                metrics.INDEXED.labels(p.op.resource).inc()
                outcomes[p.position] = Outcome(Verdict.INDEXED, event_type=event_type)
                if p.notification.timestamp is not None:
                    metrics.LAG_SECONDS.observe(
                        max(0.0, (now - p.notification.timestamp).total_seconds())
                    )
            elif result.status is WriteStatus.STALE:
                metrics.STALE.labels(p.op.resource).inc()
                outcomes[p.position] = Outcome(Verdict.STALE, "stale", event_type=event_type)
            elif result.status is WriteStatus.REJECTED:
                outcomes[p.position] = dead(
                    "rejected", f"engine rejected document: {result.reason}", event_type
                )
            else:
                retry += 1
        if retry:
            raise ItemsToRetry(f"{retry} of {len(pending)} items must be retried")

    def _count(self, outcomes: Iterable[Outcome]) -> None:
        for o in outcomes:
            metrics.CONSUMED.inc()
            if o.verdict is Verdict.DEAD:
                metrics.DEAD_LETTERED.labels(o.reason_code or "unknown").inc()
                log.warning("dead-lettering %s: %s", o.event_type or "message", o.reason)
            elif o.verdict is Verdict.IGNORED:
                metrics.IGNORED.labels(o.event_type or "").inc()
