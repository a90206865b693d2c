"""Deliveries routed straight from their frames (``cellsight.indexer.amqp_deliveries``).

Frames are built with py-amqp's own serializers, and the router's result is compared
with what py-amqp's own frame handler makes of the same frames: the same body, tag,
delivery info, properties and headers, however the body is split and whatever is
interleaved. Then through a real RabbitMQ: the indexer's consumer gets routed
deliveries, and a dead letter still carries the original's headers and routing."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.exceptions import UnexpectedFrame
from amqp.method_framing import frame_handler
from amqp.serialization import dumps, loads
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.compression import compress, decompress

from cellsight.indexer.amqp_deliveries import (
    BODY,
    DELIVER,
    DELIVER_ARGS,
    HEADER,
    HEARTBEAT,
    METHOD,
    Delivery,
    DeliveryRouter,
    _deliver_args,
    bounded_decompress,
    routed_deliveries,
    text_codec,
)
from cellsight.indexer.deadletter import wire_bytes
from cellsight.indexer.planning import plan
from cellsight.notifications.limits import MAX_BODY_BYTES

CHANNEL = 1
Frame = tuple[int, int, bytes]


class FakeChannel:
    channel_id = CHANNEL

    def __init__(self) -> None:
        self.acked: list[int] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.acked.append(tag)


class FakeConnection:
    """What the router touches of py-amqp's connection: its frame handler, counter and
    heartbeat check (``ticks``: how many times it was asked)."""

    def __init__(self) -> None:
        self.bytes_recv = 0
        self.ticks = 0
        self.passed: list[Frame] = []
        self.methods: list[tuple[int, Any, Any]] = []
        self.on_inbound_frame = frame_handler(self, self._on_method)

    def heartbeat_tick(self) -> None:
        self.ticks += 1

    def _on_method(self, channel: int, sig: Any, payload: Any, content: Any) -> bool:
        self.methods.append((channel, sig, content))
        return True


def deliver_frames(
    tag: int,
    body: bytes,
    properties: dict[str, Any],
    splits: list[int],
    channel: int = CHANNEL,
    routing_key: str = "notifications.info",
) -> list[Frame]:
    args = dumps("sLbss", ("ctag-1", tag, tag % 2 == 1, "nova", routing_key))
    method = struct.pack(">HH", *spec.Basic.Deliver) + args
    content = AmqpMessage(**properties)
    header = struct.pack(">HHQ", 60, 0, len(body)) + content._serialize_properties()
    frames: list[Frame] = [(METHOD, channel, method), (HEADER, channel, header)]
    at, i = 0, 0
    while at < len(body):
        size = max(1, splits[i % len(splits)]) if splits else len(body)
        frames.append((BODY, channel, body[at : at + size]))
        at, i = at + size, i + 1
    return frames


PROPERTIES = st.fixed_dictionaries(
    {},
    optional={
        "content_type": st.sampled_from(["application/json", "text/plain"]),
        "content_encoding": st.sampled_from(["utf-8", "binary", "latin-1"]),
        "application_headers": st.dictionaries(
            st.text(min_size=1, max_size=8), st.text(max_size=20), max_size=4
        ),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 9),
        "message_id": st.text(max_size=30),
    },
)


def amqp_reading(frames: list[Frame]) -> list[Any]:
    """py-amqp's own result for these frames: the content of each delivery."""
    conn = FakeConnection()
    for f in frames:
        conn.on_inbound_frame(f)
    return [content for _, _, content in conn.methods if content is not None]


@settings(max_examples=80, deadline=None)
@given(
    messages=st.lists(st.tuples(st.binary(max_size=5000), PROPERTIES), min_size=1, max_size=6),
    splits=st.lists(st.integers(1, 3000), max_size=5),
    noise=st.lists(st.integers(0, 40), max_size=8),
)
def test_routed_deliveries_match_py_amqps_own_reading(
    messages: list[tuple[bytes, dict[str, Any]]], splits: list[int], noise: list[int]
) -> None:
    """Heartbeats inside a delivery and other channels' frames between its frames: the
    router hands those on and builds each delivery as py-amqp would."""
    frames: list[Frame] = []
    for tag, (body, props) in enumerate(messages, start=1):
        frames += deliver_frames(tag, body, props, splits)
    mixed: list[Frame] = []
    for i, f in enumerate(frames):
        mixed.append(f)
        if i in noise:
            mixed.append((HEARTBEAT, 0, b""))
            mixed.append((METHOD, 2, struct.pack(">HH", *spec.Basic.Ack) + dumps("Lb", (i, 0))))
    conn, channel = FakeConnection(), FakeChannel()
    got: list[Delivery] = []
    router = DeliveryRouter(conn, channel, got.append)
    finished = [router(f) for f in mixed]
    expected = amqp_reading(frames)
    # A delivery, another channel's method or a heartbeat (the stream's wait ends there).
    ends = sum(1 for f in mixed if f[1] == 2 or f[0] == HEARTBEAT)
    assert finished.count(True) == len(messages) + ends
    assert [(c, s) for c, s, _ in conn.methods] == [(2, spec.Basic.Ack)] * len(conn.methods)
    assert [d.delivery_tag for d in got] == list(range(1, len(messages) + 1))
    for delivery, content, (body, props) in zip(got, expected, messages, strict=True):
        encoding = props.get("content_encoding")
        assert (content.body or b"") == body  # py-amqp has "" for an empty body
        if encoding == "latin-1":  # decoded as py-amqp's channel decodes it
            assert delivery.body == body.decode("latin-1")
        else:  # py-amqp makes text of UTF-8 when it can; the router keeps the bytes
            assert delivery.body == body
        assert delivery.properties == content.properties
        assert delivery.headers == (content.properties.get("application_headers") or {})
        assert delivery.content_type == props.get("content_type")
        assert delivery.content_encoding == encoding
        assert delivery.delivery_info == {
            "consumer_tag": "ctag-1",
            "delivery_tag": delivery.delivery_tag,
            "redelivered": delivery.delivery_tag % 2 == 1,
            "exchange": "nova",
            "routing_key": "notifications.info",
        }
    assert conn.bytes_recv >= len(frames)  # py-amqp's heartbeat check sees the traffic
    assert conn.ticks == sum(f[0] == HEARTBEAT for f in mixed)  # at each broker heartbeat


@settings(max_examples=40, deadline=None)
@given(
    body=st.binary(min_size=2, max_size=4000),
    cut=st.integers(1, 3),
    splits=st.lists(st.integers(1, 900), min_size=1, max_size=4),
)
def test_handing_back_mid_delivery_lets_py_amqp_finish_it(
    body: bytes, cut: int, splits: list[int]
) -> None:
    """Leaving the router with a delivery half read: py-amqp is replayed what the router
    had, and reads the rest as if it had read everything itself."""
    frames = deliver_frames(7, body, {"content_type": "application/json"}, splits)
    cut = min(cut, len(frames) - 1)
    conn, channel = FakeConnection(), FakeChannel()
    got: list[Delivery] = []
    router = DeliveryRouter(conn, channel, got.append)
    conn.on_inbound_frame = router
    for f in frames[:cut]:
        conn.on_inbound_frame(f)
    router.hand_back()
    assert conn.on_inbound_frame is not router
    for f in frames[cut:]:
        conn.on_inbound_frame(f)
    assert got == []
    (content,) = [c for _, _, c in conn.methods if c is not None]
    assert content.body == body


def test_other_methods_on_the_channel_go_to_py_amqp() -> None:
    conn, channel = FakeConnection(), FakeChannel()
    router = DeliveryRouter(conn, channel, lambda d: None)
    cancel = struct.pack(">HH", *spec.Basic.Cancel) + dumps("sb", ("ctag-1", 0))
    assert router((METHOD, CHANNEL, cancel)) is True
    assert [(c, s) for c, s, _ in conn.methods] == [(CHANNEL, spec.Basic.Cancel)]


def test_a_frame_out_of_order_is_refused_as_py_amqp_refuses_it() -> None:
    conn, channel = FakeConnection(), FakeChannel()
    router = DeliveryRouter(conn, channel, lambda d: None)
    method, _header, body = deliver_frames(1, b"x", {}, [])
    router(method)
    with pytest.raises(UnexpectedFrame):
        router(body)  # a body before its header
    conn, channel = FakeConnection(), FakeChannel()
    router = DeliveryRouter(conn, channel, lambda d: None)
    router(method)
    with pytest.raises(UnexpectedFrame):
        router(method)  # a new method while the content is awaited


def test_an_empty_body_is_delivered_at_its_header() -> None:
    conn, channel = FakeConnection(), FakeChannel()
    got: list[Delivery] = []
    router = DeliveryRouter(conn, channel, got.append)
    method, header = deliver_frames(3, b"", {}, [])
    assert router(method) is False
    assert router(header) is True
    assert [(d.delivery_tag, d.body) for d in got] == [(3, b"")]
    got[0].ack()
    assert channel.acked == [3]


def test_rabbitmq_deliveries_are_routed_and_keep_their_properties(rabbitmq_url: str) -> None:
    """Through a real broker: bodies arrive whole, as bytes, with their headers and
    routing; frames of another channel on the connection (a publisher's) still reach
    py-amqp, and leaving restores its handler."""
    name = f"cellsight.test.deliveries.{uuid.uuid4().hex[:8]}"
    exchange = Exchange(name, type="direct", durable=False, auto_delete=True)
    queue = Queue(name, exchange, routing_key=name, durable=False, auto_delete=True)
    bodies = [b"{}", b"", b"x" * 300_000, "caf\u00e9".encode(), b"\xff\xfe"]
    got: list[Any] = []
    with Connection(rabbitmq_url) as conn:
        channel = conn.channel()
        queue(channel).declare()
        producer = Producer(conn.channel(), exchange=exchange)
        with (
            Consumer(channel, queues=[queue], on_message=got.append, prefetch_count=50),
            routed_deliveries(conn, channel, got.append) as router,
        ):
            assert router is not None
            for i, body in enumerate(bodies):
                producer.publish(
                    body,
                    routing_key=name,
                    headers={"n": i},
                    content_type="application/json",
                    content_encoding="utf-8",
                )
            while len(got) < len(bodies):
                conn.drain_events(timeout=10)
            assert router.delivered == len(bodies)
        assert conn.connection.on_inbound_frame is router._inner
        assert all(isinstance(m, Delivery) for m in got)
        assert [m.body for m in got] == bodies
        assert [m.wire_body for m in got] == bodies  # what a dead letter would carry
        assert [m.headers for m in got] == [{"n": i} for i in range(len(bodies))]
        assert {m.delivery_info["routing_key"] for m in got} == {name}
        assert {m.content_type for m in got} == {"application/json"}
        got[-1].channel.basic_ack(got[-1].delivery_tag, multiple=True)
        queue(channel).delete()


def test_other_transports_are_not_routed() -> None:
    with Connection("memory://") as conn, routed_deliveries(conn, conn.channel(), print) as r:
        assert r is None


def routed(frames: list[Frame]) -> list[Delivery]:
    """The deliveries a router hands on for ``frames``."""
    got: list[Delivery] = []
    router = DeliveryRouter(FakeConnection(), FakeChannel(), got.append)
    for frame in frames:
        router(frame)
    return got


@pytest.mark.parametrize("codec", ["application/x-gzip", "application/x-bz2"])
def test_a_compressed_body_is_decompressed_as_kombu_does(codec: str) -> None:
    """oslo.messaging can compress (``kombu_compression``): the indexer reads the
    notification, and a dead letter would carry the bytes as they came."""
    body = b'{"event_type": "compute.instance.update"}' * 20
    packed, _ = compress(body, codec)
    props = {"application_headers": {"compression": codec}, "content_encoding": "binary"}
    got = routed(deliver_frames(1, packed, props, [100]))
    (delivery,) = got
    assert delivery.body == body
    assert delivery.wire_body == packed


@pytest.mark.parametrize("encoding", ["UTF-16", "latin-1"])
def test_a_compressed_body_is_then_decoded_by_its_encoding_as_kombu_does(encoding: str) -> None:
    """Found from outside: a body declared UTF-16 was read, and the same body compressed
    was dead-lettered as "not UTF-8" (decompressed, never decoded). kombu decompresses,
    then decodes by the content encoding."""
    text = '{"event_type": "compute.instance.update", "caf\u00e9": 1}'
    packed, _ = compress(text.encode(encoding), "application/x-gzip")
    props: dict[str, Any] = {"application_headers": {"compression": "application/x-gzip"}}
    props["content_encoding"] = encoding
    got = routed(deliver_frames(1, packed, props, [10]))
    (delivery,) = got
    assert delivery.body == text
    assert delivery.wire_body == packed


def test_a_body_that_does_not_decompress_is_not_decoded_either() -> None:
    """Its bytes stay as they came, not read as latin-1 text (a review found the
    decoding applied to the bytes that failed to decompress)."""
    props: dict[str, Any] = {"application_headers": {"compression": "application/x-gzip"}}
    props["content_encoding"] = "latin-1"
    got = routed(deliver_frames(1, b"not gzip \xe9", props, []))
    assert [d.body for d in got] == [b"not gzip \xe9"]


def test_a_body_that_does_not_decompress_stays_as_it_came() -> None:
    props = {"application_headers": {"compression": "application/x-gzip"}}
    got = routed(deliver_frames(1, b"not gzip", props, []))
    assert [d.body for d in got] == [b"not gzip"]


@pytest.mark.parametrize(
    ("encoding", "body", "read"),
    [
        ("latin-1", b"caf\xe9", "caf\u00e9"),  # decoded, as py-amqp does
        ("UTF-16", "{}".encode("utf-16"), "{}"),
        ("utf-8", b"caf\xc3\xa9", b"caf\xc3\xa9"),  # stays bytes, which decoders read
        # Python's punycode decoder takes time quadratic in its input: never used (an
        # adversarial probe's 480 KB body held the indexer 53 s); idna's is Python too.
        ("punycode", b"x" * 1000 + b"-" + b"ba" * 1000, b"x" * 1000 + b"-" + b"ba" * 1000),
        ("idna", b"xn--caf-dma", b"xn--caf-dma"),
        ("rot13", b"{}", b"{}"),  # no text encoding: a transform
        ("no-such-codec", b"{}", b"{}"),
        ("utf\x00-8", b"{}", b"{}"),  # codecs.lookup raises ValueError: it stopped the indexer
        # Past the decoder's bound it is refused as too large: not decoded first.
        ("latin-1", b"x" * (MAX_BODY_BYTES + 1), b"x" * (MAX_BODY_BYTES + 1)),
    ],
)
def test_a_body_is_decoded_only_with_a_linear_text_codec(
    encoding: str, body: bytes, read: bytes | str
) -> None:
    props = {"content_encoding": encoding}
    got = routed(deliver_frames(1, body, props, [len(body) // 2] if len(body) > 1 else []))
    (delivery,) = got
    assert delivery.body == read
    assert wire_bytes(delivery.body, encoding) == body  # its dead letter's bytes


def test_an_encoding_name_lookup_cannot_fail() -> None:
    """Names py-amqp can hand over that ``codecs.lookup`` raises on other than with
    ``LookupError`` (a lone surrogate, from its ``surrogatepass`` reading)."""
    assert text_codec("utf-8\udcff") is None
    assert text_codec("latin\x00-1") is None
    assert text_codec("LATIN-1") == "iso8859-1"


def test_dead_letters_carry_the_bytes_that_came() -> None:
    """A body py-amqp decoded from latin-1 is encoded back with latin-1, not UTF-8; a
    routed delivery's own bytes are used as they are."""
    assert wire_bytes("caf\u00e9", "latin-1") == b"caf\xe9"
    assert wire_bytes("", "binary") == b""
    assert wire_bytes(b"\xff", "utf-8") == b"\xff"


CODECS = ["application/x-gzip", "application/x-bz2", "application/x-lzma", "zlib", "bzip2", "xz"]


@settings(max_examples=80, deadline=None)
@given(body=st.binary(max_size=4000), codec=st.sampled_from(CODECS), cut=st.integers(1, 60))
def test_bounded_decompression_reads_as_kombu_does(body: bytes, codec: str, cut: int) -> None:
    """Within the limit, what kombu's ``decompress`` returns; a stream cut short raises
    where kombu's raises (the body then stays as it came)."""
    packed, _ = compress(body, codec)
    assert bounded_decompress(packed, codec, 10_000) == decompress(packed, codec)
    short = packed[: len(packed) - cut]
    assume(short)  # nothing at all: bz2's and lzma's own functions return b""
    with pytest.raises(Exception):  # noqa: B017  (each codec raises its own)
        decompress(short, codec)
    with pytest.raises(Exception):  # noqa: B017
        bounded_decompress(short, codec, 10_000)


@pytest.mark.parametrize("codec", ["application/x-gzip", "application/x-bz2", "application/x-lzma"])
def test_a_compression_bomb_is_refused_as_too_large_without_being_held(codec: str) -> None:
    """16 MiB of zeros in a few KB: decompressed only to one byte past the decoder's
    limit, which then refuses it as too large; its dead letter would carry the few KB."""
    packed, _ = compress(bytes(16 << 20), codec)
    assert len(packed) < 100_000
    props = {"application_headers": {"compression": codec}, "content_encoding": "binary"}
    got = routed(deliver_frames(1, packed, props, [len(packed)]))
    (delivery,) = got
    assert len(delivery.body) == MAX_BODY_BYTES + 1
    assert delivery.wire_body == packed
    outcomes, planned = plan([delivery.body])
    assert not planned and outcomes[0] is not None and outcomes[0].reason_code == "too_large"


short = st.text(max_size=60)


@settings(max_examples=100, deadline=None)
@given(ctag=short, tag=st.integers(0, 2**64 - 1), again=st.booleans(), ex=short, key=short)
def test_deliver_arguments_read_as_py_amqp_reads_them(
    ctag: str, tag: int, again: bool, ex: str, key: str
) -> None:
    """The fallback for names that are not UTF-8 reads valid ones as py-amqp does."""
    method = DELIVER + dumps(DELIVER_ARGS, [ctag, tag, again, ex, key])
    assert _deliver_args(method) == tuple(loads(DELIVER_ARGS, method, 4)[0])
    broken = DELIVER + dumps(DELIVER_ARGS, [ctag, tag, again, ex, b"key.\xff"])
    assert _deliver_args(broken)[4] == "key.\ufffd"


def _outcome(read: Any) -> Any:
    try:
        return read()
    except Exception:
        return "raises"


@settings(max_examples=80, deadline=None)
@given(
    first=st.binary(max_size=300),
    second=st.binary(max_size=300),
    junk=st.binary(max_size=12),
    codec=st.sampled_from(CODECS),
)
def test_streams_one_after_another_read_as_kombu_reads_them(
    first: bytes, second: bytes, junk: bytes, codec: str
) -> None:
    """bz2 and lzma read concatenated streams (as pbzip2 writes them) and skip what is
    not one; zlib stops at its first. Whatever kombu returns or raises, so does this."""
    data = compress(first, codec)[0] + compress(second, codec)[0] + junk
    assert _outcome(lambda: bounded_decompress(data, codec, 10_000)) == _outcome(
        lambda: decompress(data, codec)
    )
