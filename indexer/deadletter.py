"""The dead-letter handoff: a rejected message is acked only once the DLQ holds it.

Each dead letter is published with a confirmation (``cellsight.notifications.confirm``: publisher
confirms + ``mandatory`` on RabbitMQ, a routing check on Redis) on a connection of its
own, so confirm frames never interleave with the consumer's deliveries. Until the bus
confirms, the original stays unacked and the stream waits and retries, exactly as it
does while the engine is unavailable; on the way the DLQ is declared again on a fresh
connection, so a deleted DLQ or binding heals itself. When ``stop`` is set meanwhile,
``DeadLetterUnconfirmed`` is raised and the caller leaves the batch unacked, for the
broker to redeliver.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from amqp.serialization import dumps
from kombu import Connection, Exchange, Queue
from kombu.compression import compress

from cellsight.indexer import metrics
from cellsight.indexer.amqp_deliveries import Delivery, Received
from cellsight.notifications.confirm import (
    ConfirmingProducer,
    Refused,
    Unroutable,
    confirming_connection,
    publish_confirmed,
)

log = logging.getLogger(__name__)

REASON_HEADER = "x-cellsight-reason"
REASON_CODE_HEADER = "x-cellsight-reason-code"
REASON_MAX = 1000
HEADERS_DROPPED = "x-cellsight-headers-dropped"
# The copy's headers at most, in bytes as py-amqp writes them (or half the connection's
# frame size, if less): a copy past RabbitMQ's frame size (128 KiB by default; the
# properties go in one frame) makes the broker close the connection, and every retry
# would meet the same.
HEADERS_MAX = 64 * 1024
# Seconds between the heartbeats sent for a stream waiting on a dead letter: under a
# second, as py-amqp asks of heartbeat ticks.
KEEPALIVE_EVERY = 0.5


class DeadLetterUnconfirmed(Exception):
    """Stopped before the bus confirmed a dead letter: its original stays unacked."""


class DeadLetterer:
    def __init__(
        self,
        connection: Connection,
        *,
        exchange: str,
        dlx: Exchange,
        dlq: Queue,
        stop: threading.Event,
        max_backoff: float = 30.0,
        timeout: float = 10.0,
    ) -> None:
        self._source = connection
        self.exchange = exchange
        self.dlx = dlx
        self.dlq = dlq
        self.stop = stop
        self.max_backoff = max_backoff
        self.timeout = timeout
        self._connection: Connection | None = None
        self._producer: ConfirmingProducer | None = None
        self.retries = 0

    def send(self, message: Received, reason_code: str, reason: str, event_type: str) -> None:
        """Publish ``message`` to the DLX and return once the bus confirmed it."""
        info = message.delivery_info  # a routed delivery parses it on each read
        # A message the Redis channel could not read is delivered from its queue: the
        # route it was published with is the one to replay it by, if known.
        exchange, key = getattr(message, "original_route", None) or (
            info.get("exchange"),
            info.get("routing_key"),
        )
        headers = _copy_headers(
            message,
            {
                REASON_HEADER: reason[:REASON_MAX],
                REASON_CODE_HEADER: reason_code or "unknown",
                "x-cellsight-event-type": event_type,
                "x-original-exchange": exchange or self.exchange,
                "x-original-routing-key": key or "",
                "x-dead-lettered-at": datetime.now(UTC).isoformat(),
            },
        )
        backoff = 0.2
        while True:
            try:
                self._publish(message, headers)
                return
            except (Unroutable, Refused, OSError, *self._source.connection_errors) as exc:
                self.retries += 1
                metrics.RETRIES.inc()
                log.warning(
                    "dead letter not confirmed (%s: %s); original stays unacked, retrying in %.1fs",
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                self._reset()
            if self.stop.wait(backoff):
                raise DeadLetterUnconfirmed("stopped before the dead letter was confirmed")
            backoff = min(backoff * 2, self.max_backoff)

    def _publish(self, message: Received, headers: dict[str, Any]) -> None:
        if self._producer is None:
            # Without heartbeats: idle between letters, it sent none, and the broker
            # dropped it (``?heartbeat=N``), failing the next letter's first attempt. A
            # dead one is found by the confirm's ``timeout`` instead.
            self._connection = confirming_connection(self._source).clone(heartbeat=0)
            self._producer = ConfirmingProducer(self._connection.channel())
        # The original bytes travel unchanged so a replay after a fix is exact: a routed
        # delivery keeps them as they came; kombu's message may hold text py-amqp
        # decoded with the message's encoding (and ``""`` for an empty body, which kombu
        # would encode as "binary"), so it is encoded back with that encoding, and a
        # body kombu decompressed is compressed back.
        if isinstance(message, Delivery):
            body = message.wire_body
        else:
            body = wire_bytes(message.body, message.content_encoding)
            codec = headers.get("compression")
            if codec and not message.errors:
                # kombu decompressed it: compressed again, so the copy's body and its
                # ``compression`` header agree (a reader decompresses it as it came).
                body, _ = compress(body, codec)
        publish_confirmed(
            self._producer,
            body,
            exchange=self.dlx,
            routing_key=self.dlq.name,
            timeout=self.timeout,
            declare=[self.dlq],
            headers=headers,
            content_type=message.content_type or "application/octet-stream",
            content_encoding=message.content_encoding or "binary",
            **_trace_of(message),
        )

    def _reset(self) -> None:
        # A fresh connection also forgets kombu's declared-entity cache: the DLQ is
        # declared again on the next attempt.
        connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.release()

    def close(self) -> None:
        self._reset()


@contextlib.contextmanager
def heartbeats_meanwhile(connection: Connection) -> Iterator[None]:
    """``connection``'s heartbeats sent from a thread of their own while inside: the
    stream waits there for a batch's dead letters' confirms, retries' backoff included, and
    without them the broker dropped its connection (a bus-fault probe: the poison was
    dead-lettered twice). Safe beside py-amqp, which is no thread-safe: the stream's
    thread does not touch ``connection`` until the thread has ended."""
    if not (connection.heartbeat and connection.transport.driver_type == "amqp"):
        yield
        return
    done = threading.Event()

    def beat() -> None:
        # Only sent: the broker's are read with the next messages, before the stream's
        # own check of them.
        while not done.wait(KEEPALIVE_EVERY):
            try:
                connection.connection.send_heartbeat()
            except Exception:  # the connection is lost: the stream finds out at its ack
                return

    beating = threading.Thread(target=beat, name="dead-letter-heartbeats", daemon=True)
    beating.start()
    try:
        yield
    finally:
        done.set()
        beating.join()


def _trace_of(message: Received) -> dict[str, str]:
    """The original's ``message_id``, so a dead letter can be traced to what its
    producer logged (an adversarial probe: every letter's was None). Only a text AMQP
    can carry back (a short string: 255 bytes)."""
    message_id = (message.properties or {}).get("message_id")
    try:
        if isinstance(message_id, str) and len(message_id.encode()) <= 255:
            return {"message_id": message_id}
    except UnicodeEncodeError:
        pass
    return {}


def _copy_headers(message: Received, ours: dict[str, Any]) -> dict[str, Any]:
    """The copy's headers: the original's and ``ours``, without the original's if py-amqp
    could not read them or the copy's would pass ``HEADERS_MAX`` (measured as py-amqp
    writes them: a value may grow, a one-byte integer is written back in five); a header
    then says why they are not there. The body always travels."""
    if not isinstance(message, Delivery):
        return {**(message.headers or {}), **ours}  # the Redis bus: no frame size
    headers = {**message.headers, **ours}  # parses the properties: ``unreadable`` is set
    if message.unreadable is not None:
        return {HEADERS_DROPPED: f"unreadable: {message.unreadable}", **ours}
    frame_max = getattr(getattr(message.channel, "connection", None), "frame_max", 0)
    limit = min(HEADERS_MAX, frame_max // 2) if frame_max else HEADERS_MAX
    try:
        size = len(dumps("F", [headers]))
    except Exception as exc:  # a value py-amqp read but cannot write back
        return {HEADERS_DROPPED: f"unwritable: {type(exc).__name__}: {exc}"[:200], **ours}
    if size > limit:
        return {HEADERS_DROPPED: f"{size} bytes as copied, over {limit}", **ours}
    return headers


def wire_bytes(body: bytes | str, encoding: str | None) -> bytes:
    """A kombu message's body as it travelled: py-amqp hands over text it decoded with
    the message's content encoding, which is encoded back with it. Text no encoding
    holds (a lone surrogate kombu could not encode either) is kept, never refused: a
    dead letter that cannot be built would stop the indexer at its message."""
    if not isinstance(body, str):
        return body
    try:
        return body.encode(encoding if isinstance(encoding, str) else "utf-8")
    except (LookupError, UnicodeError):  # "binary", or text it cannot hold
        pass
    try:
        return body.encode("utf-8", "surrogateescape")  # bytes a decoder escaped, back
    except UnicodeError:
        return body.encode("utf-8", "surrogatepass")
