"""The indexer channel's deliveries taken straight from their frames, on py-amqp.

For every message py-amqp runs its frame state machine three times (method, content
header, body), parses the content properties, dispatches the method through the
connection and the channel, builds its own message and a ``delivery_info`` dict, and
kombu then wraps that in a message of its own: measured on a real 3 KB delivery replayed
through the same objects, 10.6-11.0 µs of the consumer's CPU per message, a fifth of its
process's share of the indexer's work. Of all that the indexer needs, message after
message, only the body and the delivery tag (the batch is acked with ``multiple``).

:class:`DeliveryRouter` stands in for the connection's frame handler (so both of the
consumer's read paths, the buffered bursts and py-amqp's own ``drain_events``, go
through it). Frames of a ``basic.deliver`` on the indexer's channel become a
:class:`Delivery`: the tag read from the method frame, the body from the body frames;
the rest of the method's arguments and the content properties stay raw and are parsed,
by py-amqp's own code, only when something asks for them (a dead letter copies the
headers). Every other frame, on any channel (consume-ok, cancel, channel close, the
dead-letter channel's confirms, heartbeats), goes to py-amqp's handler unchanged. The
channel has one consumer, the indexer's, so every delivery on it is the indexer's, and
the router leaves before the channel is closed. A consumer the intake cancels and
makes anew meanwhile (``UnwaitedSubscription``) is the indexer's too: the router takes
its deliveries whatever their consumer tag, an old one's included, so py-amqp's checks
for a closing channel and a consumer tag without a callback cannot apply.

As py-amqp does, a body whose content encoding is not UTF-8 (or binary) is decoded to
text with it when it can be; UTF-8 bodies stay bytes, which every decoder here reads.
Unlike py-amqp, only with the Unicode encodings, Latin-1 and cp1252 (``TEXT_CODECS``,
decoded in C in time linear in the body), and only a body within the decoder's bound:
Python's punycode decoder takes time quadratic in its input (an adversarial probe's
480 KB body held the indexer 53 s), and others may; any other stays bytes.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import struct
from collections.abc import Callable, Iterator
from typing import Any

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import loads
from kombu import Message

from cellsight.indexer.amqp_reads import py_amqp
from cellsight.notifications.compression import bounded_decompress
from cellsight.notifications.limits import MAX_BODY_BYTES

METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
DELIVER = struct.pack(">HH", *spec.Basic.Deliver)
DELIVER_ARGS = "sLbss"  # consumer tag, delivery tag, redelivered, exchange, routing key
_TAG = struct.Struct(">Q")
_HEADER = struct.Struct(">HHQH")  # class, weight, body size, property flags
CONTENT_TYPE = 1 << 15
CONTENT_ENCODING = 1 << 14
MORE_FLAGS = 1  # a second word of property flags follows (not for basic's properties)
# Encodings whose bodies stay bytes: what they spell is what a decoder reads as UTF-8.
PLAIN_ENCODINGS = frozenset({"utf-8", "utf8", "binary", "ascii", "us-ascii"})
COMPRESSION = b"compression"  # kombu's header naming a compressed body's codec
# Codecs (by their canonical names) that a body is decoded to text with.
TEXT_CODECS = frozenset(
    {"utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"}
    | {"iso8859-1", "cp1252"}
)


@functools.lru_cache(maxsize=64)
def text_codec(encoding: str) -> str | None:
    """The codec a body named ``encoding`` is decoded with, or None: it stays bytes."""
    try:
        name = codecs.lookup(encoding).name
    except (LookupError, ValueError):  # a NUL or a lone surrogate in the name: ValueError
        return None
    return name if name in TEXT_CODECS else None


class Delivery:
    """One delivery on the indexer's channel: what kombu's message offers the indexer,
    with the rarely read parts parsed on first use."""

    __slots__ = (
        "_header",
        "_method",
        "_properties",
        "body",
        "channel",
        "delivery_tag",
        "unreadable",
        "wire_body",
    )

    def __init__(self, channel: Any, method: bytes, delivery_tag: int) -> None:
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.body: bytes | str = b""  # as the consumer reads it (decompressed, decoded)
        self.wire_body = b""  # as it arrived: what a dead letter carries
        self._method = method
        self._header = b""
        self._properties: dict[str, Any] | None = None
        self.unreadable: str | None = None  # why the properties could not be parsed

    @property
    def delivery_info(self) -> dict[str, Any]:
        try:
            consumer_tag, tag, redelivered, exchange, routing_key = loads(
                DELIVER_ARGS, self._method, 4
            )[0]
        except UnicodeDecodeError:
            # A routing key need not be UTF-8 (the broker routes its bytes): read with
            # replacement, as py-amqp would raise and the dead letter needs the names.
            consumer_tag, tag, redelivered, exchange, routing_key = _deliver_args(self._method)
        return {
            "consumer_tag": consumer_tag,
            "delivery_tag": tag,
            "redelivered": redelivered,
            "exchange": exchange,
            "routing_key": routing_key,
        }

    @property
    def properties(self) -> dict[str, Any]:
        """As py-amqp parses them, or none (``unreadable`` says why) when it cannot: a
        broker passes on what a foreign client wrote (a short string that is not UTF-8, a
        timestamp past the year 9999, a table nested thousands deep), and py-amqp's
        reader raises whatever its parse meets (``ValueError``, ``RecursionError``, its
        own frame errors), so any error counts. The body stays the message's."""
        if self._properties is None:
            try:
                self._properties = _properties(self._header)
            except Exception as exc:
                self.unreadable = f"{type(exc).__name__}: {exc}"[:200]
                self._properties = {}
        return self._properties

    @property
    def headers(self) -> dict[str, Any]:
        headers: dict[str, Any] = self.properties.get("application_headers") or {}
        return headers

    @property
    def content_type(self) -> str | None:
        return self.properties.get("content_type")

    @property
    def content_encoding(self) -> str | None:
        return self.properties.get("content_encoding")

    def ack(self) -> None:
        self.channel.basic_ack(self.delivery_tag)

    def requeue(self) -> None:
        self.channel.basic_reject(self.delivery_tag, requeue=True)


Received = Message | Delivery
"""What the indexer's consumer receives: a kombu message, or a delivery routed here."""


def _properties(header: bytes) -> dict[str, Any]:
    """A content header's properties, as py-amqp parses them."""
    content = AmqpMessage()
    content.inbound_header(header)
    return dict(content.properties)


def _short_string(data: bytes, at: int) -> tuple[str, int]:
    """The AMQP short string at ``at`` (decoded with replacement) and the offset after it."""
    end = at + 1 + data[at]
    return data[at + 1 : end].decode("utf-8", "replace"), end


def _deliver_args(method: bytes) -> tuple[str, int, bool, str, str]:
    """``basic.deliver``'s arguments, its short strings decoded with replacement."""
    consumer_tag, at = _short_string(method, 4)  # after the class and method ids
    tag = _TAG.unpack_from(method, at)[0]
    redelivered = bool(method[at + 8] & 1)
    exchange, at = _short_string(method, at + 9)
    routing_key, _ = _short_string(method, at)
    return consumer_tag, tag, redelivered, exchange, routing_key


def _encoding(delivery: Delivery) -> str | None:
    """The content encoding named in a delivery's content header, read without the other
    properties: in AMQP 0-9-1 it is the second short string after the flags."""
    header = delivery._header
    flags = _HEADER.unpack_from(header)[3]
    if not flags & CONTENT_ENCODING:
        return None
    if flags & MORE_FLAGS:
        encoding: str | None = delivery.properties.get("content_encoding")
        return encoding
    at = _HEADER.size
    if flags & CONTENT_TYPE:
        _, at = _short_string(header, at)
    return _short_string(header, at)[0]


class DeliveryRouter:
    """The connection's frame handler while installed (see the module's docstring)."""

    def __init__(
        self, amqp_connection: Any, channel: Any, on_message: Callable[[Delivery], None]
    ) -> None:
        self._connection = amqp_connection
        self._inner: Callable[[tuple[int, int, bytes]], bool] = amqp_connection.on_inbound_frame
        self._channel = channel
        self._channel_id: int = channel.channel_id
        self._on_message = on_message
        self._pending: Delivery | None = None
        self._left = 0  # body bytes still to come for the pending delivery
        self._parts: list[bytes] = []
        self.delivered = 0

    def __call__(self, frame: tuple[int, int, bytes]) -> bool:
        kind, channel, payload = frame
        if channel != self._channel_id:
            handled = self._inner(frame)
            if kind == HEARTBEAT:
                # The moment to send ours: py-amqp's wait for a delivery starts again at
                # each frame, the broker's heartbeats included, so a consumer idle in it
                # never got back to ask (the broker closed it after two intervals).
                self._connection.heartbeat_tick()
                # And the wait ends, for the stream to look at its stop flag: at
                # ``?heartbeat=1`` or 2 they came within the wait's timeout, and an idle
                # indexer stayed in it for good, deaf to SIGTERM.
                return True
            return handled
        pending = self._pending
        if pending is None:
            if kind != METHOD or payload[:4] != DELIVER:
                return self._inner(frame)
            self._connection.bytes_recv += 1  # what py-amqp's heartbeat check counts
            tag_at = 5 + payload[4]  # after the consumer tag, a short string
            self._pending = Delivery(self._channel, payload, _TAG.unpack_from(payload, tag_at)[0])
            return False
        self._connection.bytes_recv += 1
        if kind == HEADER and not pending._header:
            pending._header = payload
            self._left = _HEADER.unpack_from(payload)[2]
            return self._left == 0 and self._deliver(pending)
        if kind == BODY and pending._header:
            self._left -= len(payload)
            if self._left > 0:
                self._parts.append(payload)
                return False
            if self._parts:
                self._parts.append(payload)
                payload, self._parts = b"".join(self._parts), []
            pending.body = pending.wire_body = payload
            return self._deliver(pending)
        if kind == HEARTBEAT:
            return False
        expected = BODY if pending._header else HEADER
        raise UnexpectedFrame(f"Received frame {kind} while expecting type: {expected}")

    def hand_back(self) -> None:
        """Give the frame handling back to py-amqp; a delivery read in part is replayed
        to it frame by frame, so its handler goes on from where this one stopped."""
        if self._connection.on_inbound_frame is self:
            self._connection.on_inbound_frame = self._inner
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._inner((METHOD, self._channel_id, pending._method))
        if pending._header:
            self._inner((HEADER, self._channel_id, pending._header))
        for part in self._parts:
            self._inner((BODY, self._channel_id, part))
        self._parts = []

    def _deliver(self, delivery: Delivery) -> bool:
        self._pending = None
        body = delivery.wire_body
        # As kombu's message does: a body its producer compressed (oslo.messaging's
        # ``kombu_compression``) is decompressed; if that fails it stays as it came.
        # Then a text encoding other than UTF-8 is decoded; not bytes that failed to
        # decompress, which stay as they came (a dead letter says they are not JSON).
        readable = True
        if COMPRESSION in delivery._header and (codec := delivery.headers.get("compression")):
            try:
                body = delivery.body = bounded_decompress(body, codec, MAX_BODY_BYTES)
            except Exception:
                readable = False
        if (
            readable
            and (encoding := _encoding(delivery)) is not None
            and encoding.lower() not in PLAIN_ENCODINGS
            and len(body) <= MAX_BODY_BYTES
            and (text := text_codec(encoding)) is not None
        ):
            with contextlib.suppress(UnicodeError):  # as py-amqp: undecodable stays bytes
                delivery.body = body.decode(text)
        self.delivered += 1
        self._on_message(delivery)
        return True


class UnwaitedSubscription:
    """kombu's ``Consumer`` cancelled, given a prefetch and consumed again (``intake``)
    without waiting for the broker's answers: py-amqp waits for them with no timeout, its
    socket has none, and meanwhile the consumer's loop sees neither heartbeats nor its
    stop (a review: a connection that went silent during a pause held the worker for
    good, deaf to SIGTERM). The router takes every delivery on the channel, whatever its
    consumer tag, so none needs the answers: deliveries sent before the cancel are
    handed back, and an unexpected answer is ignored by py-amqp."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._channel = consumer.channel

    def cancel(self) -> None:
        for tag in self._consumer._active_tags.values():
            self._channel.basic_cancel(tag, nowait=True)
            self._channel.callbacks.pop(tag, None)  # py-amqp drops it on the answer only
        self._consumer._active_tags.clear()
        self._consumer._active_queue_no_ack.clear()

    def qos(self, prefetch_size: int = 0, prefetch_count: int = 0) -> None:
        self._channel.send_method(spec.Basic.Qos, "lBb", (prefetch_size, prefetch_count, False))

    def consume(self) -> None:
        for queue in self._consumer.queues:
            self._consumer._basic_consume(queue, nowait=True)  # its own tag: no answer needed


@contextlib.contextmanager
def routed_deliveries(
    connection: Any, channel: Any, on_message: Callable[[Delivery], None]
) -> Iterator[DeliveryRouter | None]:
    """Route ``channel``'s deliveries to ``on_message`` while inside (py-amqp, over TCP
    or TLS: frames are the same; other transports get None and keep kombu's own path).
    Enter right after the channel's consumer started: py-amqp has then read up to its
    consume-ok and no further, so no delivery is half-read by its handler."""
    amqp_connection = py_amqp(connection)
    if amqp_connection is None:
        yield None
        return
    router = DeliveryRouter(amqp_connection, channel, on_message)
    amqp_connection.on_inbound_frame = router
    try:
        yield router
    finally:
        router.hand_back()
