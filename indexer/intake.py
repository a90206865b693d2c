"""The bytes of message bodies an indexer worker holds, and their bound.

``prefetch_count`` bounds how many messages the broker sends ahead of acks, not their
size: RabbitMQ does not implement ``prefetch_size``. Messages held while the engine is
slow or frozen stay in the worker's memory (a probe: 250 messages of 3.5 MB, 0.97 GB;
near the 4 MiB body limit, 2,000 of them would be 8 GiB). :class:`Intake` counts the
bodies received and not yet settled; once they reach ``limit`` bytes the consumer is
cancelled, so the broker sends nothing more, and what it had already sent (up to the
prefetch, on its way before the cancel) is handed back, rejected with requeue, for
another worker or for this one later. Consuming resumes once half the limit is held, so
a stream of large messages does not cancel and consume again for every one of them.

A message handed back was never held: nothing is lost, only its order changes, which
the versioned writes tolerate (a redelivery, as after a reconnect).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from cellsight.indexer import metrics
from cellsight.indexer.amqp_deliveries import Received

log = logging.getLogger(__name__)


class Subscription(Protocol):
    """kombu's ``Consumer``: cancelled and consumed again on the same channel."""

    def cancel(self) -> None: ...

    def consume(self) -> object: ...


def size(message: Received) -> int:
    return len(message.body or b"")


class Intake:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.paused = False
        self.handed_back = 0

    def admit(self, message: Received) -> bool:
        """Whether to keep ``message`` (counted as held); False: the caller hands it
        back. One message is always kept when nothing is held, whatever its size."""
        if self.paused or self.held >= self.limit:
            self.handed_back += 1
            metrics.HANDED_BACK.inc()
            return False
        self.held += size(message)  # the gauge is set by ``steer``, once a burst
        return True

    def settled(self, messages: Iterable[Received]) -> None:
        self.held = max(0, self.held - sum(map(size, messages)))
        metrics.HELD_BYTES.set(self.held)

    def reset(self) -> None:
        """A new channel: nothing held, and its consumer consumes."""
        self.held = 0
        self.paused = False
        metrics.HELD_BYTES.set(0)

    def steer(self, consumer: Subscription) -> None:
        """Cancel ``consumer`` at the limit; consume again at half of it."""
        metrics.HELD_BYTES.set(self.held)
        if not self.paused and self.held >= self.limit:
            # Paused first: what arrives while the cancel waits for its answer is handed
            # back (the broker sends the cancel's answer after them).
            self.paused = True
            log.info("holding %d bytes of messages (limit %d): consuming paused",
                     self.held, self.limit)  # fmt: skip
            consumer.cancel()
        elif self.paused and self.held <= self.limit // 2:
            consumer.consume()
            self.paused = False
            log.info("holding %d bytes of messages: consuming again", self.held)
