"""The bytes of message bodies an indexer worker holds, and their bound.

``prefetch_count`` bounds how many messages the broker sends ahead of acks, not their
size: RabbitMQ does not implement ``prefetch_size``. Messages held while the engine is
slow or frozen stay in the worker's memory (a probe: 250 messages of 3.5 MB, 0.97 GB;
near the 4 MiB body limit, 2,000 of them would be 8 GiB). :class:`Intake` counts the
bodies received and not yet settled; once they reach ``limit`` bytes the consumer is
cancelled, so the broker sends nothing more, and what it had already sent (on its way
before the cancel) is handed back, rejected with requeue, for another worker or for
this one later. Consuming resumes once half the limit is held, with a prefetch of as
many messages of the recent mean size as fit in what is left: resumed with the whole
prefetch, the broker sent the backlog again each time and most of it was handed back
(a probe: 18,520 hand-backs draining 600 messages of 1-3.5 MB, the broker at 35-58% of a
core). Once twice as many fit (the messages are smaller again), the consumer is made
anew with what fits, up to the whole prefetch.

A message handed back was never held: nothing is lost, only its order changes, which
the versioned writes tolerate (a redelivery, as after a reconnect).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Protocol

from cellsight.indexer import metrics
from cellsight.indexer.amqp_deliveries import Received

log = logging.getLogger(__name__)

MEAN_WEIGHT = 1 / 8  # of each message in the running mean of their sizes


class Subscription(Protocol):
    """kombu's ``Consumer``: cancelled and consumed again on the same channel; its
    ``qos`` applies to the consumers made after it (RabbitMQ's per-consumer prefetch)."""

    def cancel(self) -> None: ...

    def consume(self) -> object: ...

    def qos(self, prefetch_size: int = 0, prefetch_count: int = 0) -> object: ...


def size(message: Received) -> int:
    """The bytes a message holds: its body as read, and as it came when that differs (a
    compressed one, or text decoded from UTF-16 or UTF-32, counted by its size in
    memory, not its length in characters)."""
    body = message.body or b""
    held = sys.getsizeof(body) if isinstance(body, str) else len(body)
    wire = getattr(message, "wire_body", None)
    if wire is not None and wire is not body:
        held += len(wire)
    return held


class Intake:
    def __init__(self, limit: int, prefetch: int) -> None:
        self.limit = limit
        self.prefetch = prefetch  # the consumer's, as configured
        self.granted = prefetch  # the one the current consumer was made with
        self.held = 0
        self.paused = False
        self.handed_back = 0
        self.mean = 0.0  # bytes a message, recently

    def admit(self, message: Received) -> bool:
        """Whether to keep ``message`` (counted as held); False: the caller hands it
        back. One message is always kept when nothing is held, whatever its size."""
        n = size(message)
        self.mean += (n - self.mean) * MEAN_WEIGHT if self.mean else n
        if self.full:
            self.handed_back += 1
            metrics.HANDED_BACK.inc()
            return False
        self.held += n  # the gauge is set by ``steer``, once a burst
        return True

    def settled(self, messages: Iterable[Received]) -> None:
        self.held = max(0, self.held - sum(map(size, messages)))
        metrics.HELD_BYTES.set(self.held)

    def reset(self) -> None:
        """A new channel: nothing held, and its consumer made with the whole prefetch."""
        self.held = 0
        self.paused = False
        self.granted = self.prefetch
        metrics.HELD_BYTES.set(0)

    def steer(self, consumer: Subscription) -> None:
        """Cancel ``consumer`` at the limit; consume again at half of it, with the
        prefetch that fits; made anew with a larger one as the messages get smaller."""
        metrics.HELD_BYTES.set(self.held)
        if self.paused:
            if self.held <= self.limit // 2:
                self._consume(consumer, self.fitting())
                self.paused = False
                log.info("holding %d bytes of messages: consuming again, %d at a time",
                         self.held, self.granted)  # fmt: skip
        elif self.held >= self.limit:
            # Paused first: what arrives while the cancel waits for its answer is handed
            # back (the broker sends the cancel's answer after them).
            self.paused = True
            log.info("holding %d bytes of messages (limit %d): consuming paused",
                     self.held, self.limit)  # fmt: skip
            consumer.cancel()
        elif self.granted < self.prefetch and self.fitting() >= min(
            self.prefetch, 2 * self.granted
        ):
            # Smaller messages now: twice as many fit, or the whole prefetch (a grant that
            # grew only back to the whole prefetch stayed at 21 for messages of 40 KB).
            consumer.cancel()  # what it had sent arrives meanwhile, and is kept
            self._consume(consumer, self.fitting())

    @property
    def full(self) -> bool:
        """At the limit: the next message is handed back."""
        return self.paused or self.held >= self.limit

    def fitting(self) -> int:
        """Messages of the recent mean size that fit in what is left of the limit, at
        least one and at most the prefetch."""
        if self.mean <= 0:
            return self.prefetch
        room = max(0, self.limit - self.held)
        return max(1, min(self.prefetch, int(room // self.mean)))

    def _consume(self, consumer: Subscription, prefetch: int) -> None:
        if prefetch != self.granted:
            consumer.qos(prefetch_count=prefetch)
            self.granted = prefetch
        consumer.consume()
