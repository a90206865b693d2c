"""Batches being written while the consumer receives and decodes the next ones.

Writer threads run ``BatchWriter.commit`` (engine reads, the versioned bulk write and
its retries); the consumer's thread keeps the bus: it receives, decodes, launches, and
settles finished flights strictly in launch order, so that on AMQP one ``basic.ack``
with ``multiple`` never covers a message whose write is still running.

Two flights never share an instance id: a tag-less payload takes its tags from the
stored document below it, which a write still in flight would not have stored yet, so
a batch that touches an id in flight waits for that flight (the engine's external
versions already keep concurrent writes of one id correct; this keeps the tag merge
correct too).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

from cellsight.indexer import metrics
from cellsight.indexer.amqp_deliveries import Delivery, Received
from cellsight.indexer.outcomes import dead
from cellsight.indexer.writer import BatchWriter, Outcome, Planned
from cellsight.notifications.errors import MalformedNotification
from cellsight.notifications.unreadable import UNREADABLE_CODES

log = logging.getLogger(__name__)

STALL_WARN = 60.0  # seconds the oldest batch may wait before each warning

MALFORMED = MalformedNotification.reason

# Kafka Connect's Elasticsearch sink default for max.in.flight.requests.
HTTP_IN_FLIGHT = 5
HTTP_DISTRIBUTIONS = ("elasticsearch", "opensearch")


def default_in_flight(distribution: str) -> int:
    """One write at a time on the embedded engine (SQLite has one writer; a second one
    would only wait on its lock), several bulk requests on a cluster."""
    return HTTP_IN_FLIGHT if distribution in HTTP_DISTRIBUTIONS else 1


class Settled(Protocol):
    messages: list[Received]
    started: float


class Pipeline(Protocol):
    """What the consumer drives: ``Flights`` (writer threads in this process) or
    ``write_process.WriteProcess`` (the engine's writes in a child process)."""

    limit: int  # batches held at most, launched and not yet settled

    def __len__(self) -> int: ...
    @property
    def messages(self) -> int: ...
    def prepare(self, messages: list[Received]) -> Any: ...
    def can_take(self, batch: Any) -> bool: ...
    def launch(self, batch: Any) -> None: ...
    def any_settled(self) -> bool: ...
    def settled(self) -> Iterator[tuple[Settled, list[Outcome]]]: ...
    def wait_oldest(self, timeout: float) -> None: ...
    def watch(self) -> None: ...
    def abort(self) -> None: ...
    def forget(self, grace: float) -> int: ...
    def close(self) -> None: ...


@dataclass
class PlannedBatch:
    """Received and decoded, not yet handed to a writer thread."""

    messages: list[Received]
    outcomes: list[Outcome | None]
    planned: list[Planned]
    ids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = frozenset(p.op.id for p in self.planned if p.op.resource == "instance")


@dataclass
class Flight:
    messages: list[Received]
    ids: frozenset[str]
    future: Future[list[Outcome]]
    started: float


class Ordered:
    """What both pipelines share: batches planned on the consumer's thread, then held in
    the order they were launched until settled."""

    writer: BatchWriter
    _queue: deque[Any]
    _warned_at: float = 0.0  # perf_counter of the last stall warning

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def messages(self) -> int:
        return sum(len(f.messages) for f in self._queue)

    def watch(self) -> None:
        """The age of the oldest batch not yet settled, as a gauge, and a warning each
        ``STALL_WARN`` it keeps waiting: a writer process stopped or wedged said nothing
        and its indexer looked healthy (a probe), an engine retried through an outage
        says so too."""
        now = time.perf_counter()
        age = now - self._queue[0].started if self._queue else 0.0
        metrics.UNSETTLED_SECONDS.set(age)
        if age < STALL_WARN:
            self._warned_at = 0.0
        elif now - self._warned_at >= STALL_WARN:
            self._warned_at = now
            log.warning(
                "the oldest batch in flight has waited %.0fs, %d messages unacked: the "
                "engine is being retried, or the writer is stopped or blocked",
                age,
                self.messages,
            )

    def prepare(self, messages: list[Received]) -> PlannedBatch:
        """Decode and map (CPU only), on the consumer's thread while others are written."""
        bodies = [m.body for m in messages]
        refused = unreadable_on_bus(messages)
        for position in refused:
            bodies[position] = b""  # what was on the list: not decoded, whatever it holds
        outcomes, planned = self.writer.plan(bodies)
        for position, outcome in refused.items():
            outcomes[position] = outcome
        return PlannedBatch(messages, outcomes, planned)


def unreadable_on_bus(messages: list[Received]) -> dict[int, Outcome]:
    """The dead letters of the messages the embedded bus's channel could not read
    (``redis_transport``): their bodies are what was on the list, never a notification
    to index, whatever they hold. Known by the channel's mark (``Message.unreadable``),
    not by headers, which any producer sets. RabbitMQ's deliveries are never such."""
    refused: dict[int, Outcome] = {}
    for position, message in enumerate(messages):
        if type(message) is Delivery:
            continue
        mark = getattr(message, "unreadable", None)
        if mark is not None:
            code, why = mark
            refused[position] = dead(code if code in UNREADABLE_CODES else MALFORMED, why)
    return refused


class Flights(Ordered):
    """At most ``limit`` batches being written, settled in the order they started."""

    def __init__(self, writer: BatchWriter, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max in-flight writes must be at least 1, not {limit}")
        self.writer = writer
        self.limit = limit
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="indexer-write")
        self._queue: deque[Flight] = deque()

    def can_take(self, batch: PlannedBatch) -> bool:
        return len(self._queue) < self.limit and not any(f.ids & batch.ids for f in self._queue)

    def launch(self, batch: PlannedBatch) -> None:
        future = self._pool.submit(self.writer.commit, batch.outcomes, batch.planned)
        self._queue.append(Flight(batch.messages, batch.ids, future, time.perf_counter()))

    def any_settled(self) -> bool:
        return bool(self._queue) and self._queue[0].future.done()

    def settled(self) -> Iterator[tuple[Flight, list[Outcome]]]:
        """Finished flights from the oldest on, stopping at the first still running.
        A failed write raises here: its messages (and every later flight's) stay
        unacked, and the broker redelivers them to the next consumer."""
        while self._queue and self._queue[0].future.done():
            flight = self._queue.popleft()
            yield flight, flight.future.result()

    def wait_oldest(self, timeout: float) -> None:
        if self._queue:
            with contextlib.suppress(FutureTimeout):
                self._queue[0].future.exception(timeout=max(0.0, timeout))

    def abort(self) -> None:
        """Stop retrying: a write blocked by an outage is abandoned, unacked (the writer's
        ``stop`` is the consumer's abort event)."""
        self.writer.stop.set()

    def forget(self, grace: float) -> int:
        """Drop every flight unsettled (their messages will be redelivered); wait up to
        ``grace`` seconds for the running writes so they do not outlive the caller's
        engine. Returns how many messages were dropped."""
        dropped = self.messages
        deadline = time.monotonic() + grace
        for flight in self._queue:
            if flight.future.cancel():  # never started
                continue
            try:
                flight.future.exception(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                log.warning("a write is still running after %.1fs; leaving it", grace)
                break
        self._queue.clear()
        return dropped

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
