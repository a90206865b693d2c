"""Inspect and re-drive the dead-letter queue."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kombu import Connection, Producer

from indexer.consumer import REASON_CODE_HEADER, REASON_HEADER
from notifications import queues


@dataclass(frozen=True)
class DeadLetter:
    reason_code: str
    reason: str
    event_type: str
    routing_key: str
    dead_lettered_at: str
    body: bytes

    @classmethod
    def from_message(cls, headers: dict[str, Any], body: Any) -> DeadLetter:
        raw = body if isinstance(body, bytes) else str(body).encode()
        return cls(
            reason_code=str(headers.get(REASON_CODE_HEADER, "")),
            reason=str(headers.get(REASON_HEADER, "")),
            event_type=str(headers.get("x-cellsight-event-type", "")),
            routing_key=str(headers.get("x-original-routing-key", "")),
            dead_lettered_at=str(headers.get("x-dead-lettered-at", "")),
            body=raw,
        )


def peek(
    connection: Connection, dlx_name: str, dlq_name: str, limit: int = 100
) -> Iterator[DeadLetter]:
    """Read up to ``limit`` dead letters without removing them: nothing is acked, and
    closing the channel returns every fetched message to the queue."""
    dlq = queues.dead_letter_queue(dlq_name, queues.dead_letter_exchange(dlx_name))
    with connection.channel() as channel:
        bound = dlq(channel)
        bound.declare()
        for _ in range(limit):
            message = bound.get(no_ack=False, accept=None)
            if message is None:
                break
            yield DeadLetter.from_message(message.headers or {}, message.body)


def replay(
    connection: Connection,
    *,
    exchange_name: str,
    dlx_name: str,
    dlq_name: str,
    limit: int | None = None,
    reason_code: str | None = None,
) -> tuple[int, int]:
    """Republish dead letters to the notifications exchange, each acked only after its
    republish was confirmed. Returns (replayed, left in the queue)."""
    exchange = queues.notifications_exchange(exchange_name)
    dlq = queues.dead_letter_queue(dlq_name, queues.dead_letter_exchange(dlx_name))
    replayed = skipped = 0
    with connection.channel() as channel, connection.channel() as pub_channel:
        bound = dlq(channel)
        bound.declare()
        # kombu's Redis transport keeps exchange types per process: declare before use.
        exchange(pub_channel).declare()
        producer = Producer(pub_channel)
        held = []
        while limit is None or replayed < limit:
            message = bound.get(no_ack=False, accept=None)
            if message is None:
                break
            letter = DeadLetter.from_message(message.headers or {}, message.body)
            if reason_code is not None and letter.reason_code != reason_code:
                held.append(message)  # returned to the queue when the channel closes
                skipped += 1
                continue
            producer.publish(
                letter.body,
                exchange=exchange,
                routing_key=letter.routing_key or "versioned_notifications.info",
                content_type=message.content_type or "application/json",
                content_encoding=message.content_encoding or "utf-8",
                delivery_mode=2,
                retry=True,
            )
            message.ack()
            replayed += 1
        for message in held:
            message.requeue()
    return replayed, skipped
