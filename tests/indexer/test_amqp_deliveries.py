"""Deliveries routed straight from their frames (``cellsight.indexer.amqp_deliveries``).

Frames are built with py-amqp's own serializers, and the router's result is compared
with what py-amqp's own frame handler makes of the same frames: the same body, tag,
delivery info, properties and headers, however the body is split and whatever is
interleaved. Then through a real RabbitMQ: the indexer's consumer gets routed
deliveries, and a dead letter still carries the original's headers and routing.
(A delivery's body, decompressed and decoded: ``test_amqp_delivery_bodies``.)"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from amqp import spec
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import dumps, loads
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Producer, Queue

from cellsight.indexer.amqp_deliveries import (
    DELIVER,
    DELIVER_ARGS,
    HEARTBEAT,
    METHOD,
    Delivery,
    DeliveryRouter,
    _deliver_args,
    routed_deliveries,
)
from tests.support.amqp_frames import (
    CHANNEL,
    FakeChannel,
    FakeConnection,
    Frame,
    deliver_frames,
)

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
