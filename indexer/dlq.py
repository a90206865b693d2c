"""Inspect and re-drive the dead-letter queue."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from kombu import Connection, Message, Queue

from cellsight.indexer.deadletter import REASON_CODE_HEADER, REASON_HEADER, wire_bytes
from cellsight.notifications import queues
from cellsight.notifications.compression import bounded_decompress
from cellsight.notifications.confirm import (
    ConfirmingProducer,
    confirming_connection,
    publish_confirmed,
)
from cellsight.notifications.errors import NotificationError, PublishError, escaped
from cellsight.notifications.limits import MAX_BODY_BYTES
from cellsight.signal_events import signals_held


def _contract_reasons() -> list[str]:
    """The codes of the contract's errors the decoder raises (``notifications.errors``;
    not those of ``PublishError`` and its kinds, a producer's, nor the base's, which
    none raises)."""
    codes: list[str] = []
    kinds = list(NotificationError.__subclasses__())
    while kinds:
        kind = kinds.pop(0)
        if issubclass(kind, PublishError):
            continue
        kinds.extend(kind.__subclasses__())
        if kind.reason not in codes:
            codes.append(kind.reason)
    return codes


REASON_CODES: tuple[str, ...] = (
    *_contract_reasons(),
    "not_an_instance",  # indexer.planning: an instance event without InstancePayload's fields
    "not_a_node",  # indexer.planning: a compute_node event without a ComputeNodePayload
    "rejected",  # indexer.writer: the engine refused the document
    "internal",  # indexer.planning.INTERNAL: an exception nobody foresaw
    "unknown",  # indexer.deadletter: a letter that came without a code
)
"""Every reason code a dead letter can carry (``x-cellsight-reason-code``)."""


@dataclass(frozen=True)
class DeadLetter:
    reason_code: str
    reason: str
    event_type: str
    routing_key: str
    dead_lettered_at: str
    body: bytes
    message_id: str | None = None  # the original's (``deadletter``), for tracing

    @classmethod
    def of(cls, message: Any) -> DeadLetter:
        """The letter a kombu message of the dead-letter queue holds."""
        message_id = (message.properties or {}).get("message_id")
        return cls.from_message(
            message.headers or {},
            message.body,
            message.content_encoding,
            message_id if isinstance(message_id, str) else None,
        )

    @classmethod
    def from_message(
        cls,
        headers: dict[str, Any],
        body: Any,
        encoding: str | None = None,
        message_id: str | None = None,
    ) -> DeadLetter:
        raw = wire_bytes(body if isinstance(body, bytes) else str(body), encoding)
        return cls(
            reason_code=_text(headers.get(REASON_CODE_HEADER, "")),
            reason=_text(headers.get(REASON_HEADER, "")),
            event_type=_text(headers.get("x-cellsight-event-type", "")),
            routing_key=_text(headers.get("x-original-routing-key", "")),
            dead_lettered_at=_text(headers.get("x-dead-lettered-at", "")),
            body=raw,
            message_id=None if message_id is None else _text(message_id),
        )


def _text(value: Any) -> str:
    """A header as text that prints: a lone surrogate (which a letter's reason may quote
    from what the bus could not read) is escaped, not left to fail the terminal's
    encoding and stop the listing at that letter."""
    return escaped(str(value))


def get_as_stored(bound: Queue) -> Message | None:
    """The next dead letter, unacked, as ``Queue.get`` gives it, but read as stored: its
    body's bytes as they are (py-amqp would decode text with the content encoding, and
    one that does not encode back the same, a BOM added or turned, an escape undone,
    would change); a compressed body decompressed no further than the decoder's limit
    (kombu would hold a compression bomb whole; past the limit the stored bytes stay);
    and one that does not decompress, or that kombu could not prepare, as stored with
    the error in ``errors`` (``Queue.get`` raises it, and one such letter would stop
    every reader of the queue at it)."""
    channel: Any = bound.channel
    decoding = getattr(channel, "auto_decode", None)  # py-amqp's; the Redis bus's is bytes
    if decoding is not None:
        channel.auto_decode = False
    try:
        message = channel.basic_get(queue=bound.name, no_ack=False)
    finally:
        if decoding is not None:
            channel.auto_decode = decoding
    to_python = getattr(channel, "message_to_python", None)
    if message is None or to_python is None:
        return message
    headers = getattr(message, "properties", {}).get("application_headers")
    codec = headers.pop("compression", None) if isinstance(headers, dict) else None
    message = to_python(message)
    if codec:
        message.headers["compression"] = codec
        try:
            body = bounded_decompress(message.body, codec, MAX_BODY_BYTES)
        except Exception:
            message.errors.append(sys.exc_info())
        else:
            if len(body) <= MAX_BODY_BYTES:
                message.body = body
    return message


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
            message = get_as_stored(bound)
            if message is None:
                break
            yield DeadLetter.of(message)


class ReplayRefused(Exception):
    """A dead letter could not be republished routably: it stays in the DLQ."""

    def __init__(self, message: str, replayed: int) -> None:
        super().__init__(message)
        self.replayed = replayed


class ReplayInterrupted(Exception):
    """Ctrl-C (or SIGTERM) during a replay: what was replayed is replayed, the letter
    being republished stays in the DLQ (at worst it is then on the bus twice), the rest
    stay."""

    def __init__(self, replayed: int) -> None:
        super().__init__(f"interrupted after replaying {replayed} letter(s); the rest stay")
        self.replayed = replayed


class Replayed(NamedTuple):
    """What a replay did with the letters in the queue when it started."""

    replayed: int
    other_reason: int  # read and left: another reason than ``reason_code``
    unread: int  # left unread, past ``limit``


def replay(
    connection: Connection,
    *,
    exchange_name: str,
    dlx_name: str,
    dlq_name: str,
    limit: int | None = None,
    reason_code: str | None = None,
    timeout: float = 10.0,
) -> Replayed:
    """Republish dead letters to the notifications exchange, each acked (removed from the
    DLQ) only after the bus confirmed its republish reached a queue.

    Only the letters in the queue when it starts are read: a replayed letter that is
    still bad comes back at the queue's tail (the running indexer dead-letters it again),
    and reading on would replay it again and again, for ever.

    Raises ``ReplayRefused`` at the first letter the bus does not take (nothing bound to
    its routing key, a nack): that letter and all after it stay in the DLQ.
    """
    exchange = queues.notifications_exchange(exchange_name)
    dlq = queues.dead_letter_queue(dlq_name, queues.dead_letter_exchange(dlx_name))
    replayed = skipped = 0
    held: list[Message] = []
    with connection.channel() as channel, confirming_connection(connection) as publishing:
        bound = dlq(channel)
        bound.declare()
        # Counted by declaring it again, not passively: on Redis an empty queue has no
        # key, and a passive declare of it was a 404 (an operator's walk through the
        # README: ``dlq replay`` failed on a new data directory and once all had gone).
        _, waiting, _ = bound.queue_declare()
        producer = ConfirmingProducer(publishing.channel())
        taken: Message | None = None  # the letter being replayed, not yet acked
        try:
            while (limit is None or replayed < limit) and replayed + skipped < waiting:
                message = taken = get_as_stored(bound)
                if message is None:
                    break
                letter = DeadLetter.of(message)
                if reason_code is not None and letter.reason_code != reason_code:
                    held.append(message)
                    skipped += 1
                    continue
                key = letter.routing_key or queues.routing_key("info")
                trace: dict[str, Any] = (
                    {"message_id": letter.message_id} if letter.message_id else {}
                )
                try:
                    publish_confirmed(
                        producer,
                        letter.body,
                        exchange=exchange,
                        routing_key=key,
                        timeout=timeout,
                        content_type=message.content_type or "application/json",
                        content_encoding=message.content_encoding or "utf-8",
                        **trace,
                    )
                except PublishError as exc:
                    message.requeue()
                    raise ReplayRefused(
                        f"dead letter ({letter.reason_code} {letter.event_type or '-'}) not "
                        f"replayed, it stays in {dlq_name!r}: {exc}",
                        replayed,
                    ) from exc
                message.ack()
                replayed += 1
        except KeyboardInterrupt as exc:
            raise ReplayInterrupted(replayed) from exc
        finally:
            # Back in the queue, a second signal notwithstanding: interrupted, the letter
            # being replayed stayed taken (on Redis, in kombu's unacked hash until a
            # consumer restored it minutes later; an interrupt probe).
            with signals_held():
                for message in [*held, *([taken] if taken is not None else [])]:
                    if not message.acknowledged:
                        message.requeue()
    limited = limit is not None and replayed >= limit
    return Replayed(replayed, skipped, max(0, waiting - replayed - skipped) if limited else 0)
