"""Buffered AMQP reads (``cellsight.indexer.amqp_reads``): frames come out byte for byte
as the socket carried them, however the bytes were split, and a whole frame is reported
ready only when every byte of it is buffered. Then the same through a real RabbitMQ,
with bodies larger than a frame and than the buffer."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import UnexpectedFrame
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Message, Producer, Queue

from cellsight.indexer.amqp_reads import (
    FRAME_END,
    FRAME_HEADER,
    BufferedRecv,
    FrameReader,
    buffered_frames,
)
from cellsight.indexer.consumer import ConsumerConfig, IndexerConsumer
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return (
        bytes([kind])
        + channel.to_bytes(2, "big")
        + len(payload).to_bytes(4, "big")
        + (payload + b"\xce")
    )


def read_frame(recv: BufferedRecv) -> bytes:
    """As py-amqp reads: exactly n bytes by repeated calls that may return fewer."""

    def exactly(n: int) -> bytes:
        got = b""
        while len(got) < n:
            part = recv(n - len(got))
            assert part, "socket closed mid-frame"
            got += part
        return got

    header = exactly(FRAME_HEADER)
    size = int.from_bytes(header[3:7], "big")
    return header + exactly(size) + exactly(FRAME_END)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@contextmanager
def streamed(wire: bytes, cuts: list[int], chunk: int) -> Iterator[BufferedRecv]:
    """A reader of ``wire``, sent from another thread in pieces of the ``cuts`` sizes."""
    a, b = socket.socketpair()

    def send() -> None:
        position, i = 0, 0
        while position < len(wire):
            size = cuts[i % len(cuts)]
            a.sendall(wire[position : position + size])
            position, i = position + size, i + 1

    sender = threading.Thread(target=send)
    sender.start()
    try:
        yield BufferedRecv(b.recv, chunk=chunk)
        sender.join()
    finally:
        a.close()
        b.close()


CUTS = st.lists(st.integers(min_value=1, max_value=4000), min_size=1, max_size=20)
CHUNKS = st.integers(min_value=1, max_value=600)


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=12), cuts=CUTS, chunk=CHUNKS
)
def test_frames_survive_any_split(payloads: list[bytes], cuts: list[int], chunk: int) -> None:
    frames = [frame(3, i % 3, p) for i, p in enumerate(payloads)]
    with streamed(b"".join(frames), cuts, chunk) as recv:
        got = [read_frame(recv) for _ in frames]
    assert got == frames
    assert recv.buffered == 0


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.integers(1, 8), st.integers(0, 65535), st.binary(max_size=3000)),
        min_size=1,
        max_size=12,
    ),
    cuts=CUTS,
    chunk=CHUNKS,
)
def test_take_frame_returns_what_read_frame_would(
    parts: list[tuple[int, int, bytes]], cuts: list[int], chunk: int
) -> None:
    """Whole frames are cut from the buffer, the rest read as py-amqp reads; either way
    each frame comes out as (type, channel, payload), in order, and nothing is left."""
    got: list[tuple[int, int, bytes]] = []
    with streamed(b"".join(frame(*p) for p in parts), cuts, chunk) as recv:
        for _ in parts:
            whole, buffered = recv.whole_frame(), recv.buffered
            taken = recv.take_frame()
            assert (taken is not None) == whole
            if taken is not None:
                got.append(taken)
            else:
                assert recv.buffered == buffered  # a partial frame is left where it is
                raw = read_frame(recv)
                got.append((raw[0], int.from_bytes(raw[1:3], "big"), raw[FRAME_HEADER:-1]))
    assert got == parts
    assert recv.buffered == 0


def test_take_frame_refuses_a_frame_without_its_end_octet(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    bad = frame(1, 0, b"payload")[:-1] + b"\x00"
    a.sendall(bad + frame(3, 1, b"next"))
    recv = BufferedRecv(b.recv, chunk=4096)
    assert recv(0) == b""  # an empty read fills the buffer
    assert recv.whole_frame()
    with pytest.raises(UnexpectedFrame, match="0x00"):
        recv.take_frame()


def test_whole_frame_only_when_every_byte_is_buffered(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    first, second = frame(1, 0, b"x" * 50), frame(3, 1, b"y" * 10)
    recv = BufferedRecv(b.recv, chunk=4096)
    assert not recv.whole_frame()  # nothing read yet
    a.sendall(first + second[:-1])
    assert read_frame(recv) == first  # one recv filled the buffer with both
    assert recv.buffered == len(second) - 1
    assert not recv.whole_frame()  # `second` lacks its end octet
    assert recv.take_frame() is None  # and is left where it is
    assert recv.buffered == len(second) - 1
    assert recv(FRAME_HEADER) == second[:FRAME_HEADER]  # served from the buffer
    a.sendall(second[-1:] + second)
    assert recv(len(second)) == second[FRAME_HEADER:-1]  # what is buffered, no more
    assert recv.buffered == 0
    assert recv(1) == second[-1:]  # the next recv brings the end octet and a whole frame
    assert recv.whole_frame()
    assert read_frame(recv) == second
    assert not recv.whole_frame()


class Dispatched:
    """Stands for py-amqp's connection where only our reader's loop is under test (the
    RabbitMQ test below runs it against the real one): what it dispatched, in order."""

    def __init__(self) -> None:
        self.transport = type("Transport", (), {"_read_buffer": b""})()
        self.frames: list[tuple[int, int, bytes]] = []

    def on_inbound_frame(self, frame: tuple[int, int, bytes]) -> None:
        self.frames.append(frame)


@pytest.mark.parametrize("cut", [3, FRAME_HEADER + 2])  # inside the header, the payload
def test_read_frames_stops_at_a_partial_frame_and_at_its_limit(
    pair: tuple[socket.socket, socket.socket], cut: int
) -> None:
    a, b = pair
    frames = [(1, 1, b"method"), (2, 1, b"header"), (3, 1, b"body")]
    last = frame(3, 1, b"next body")
    a.sendall(b"".join(frame(*f) for f in frames) + last[:cut])
    connection = Dispatched()
    recv = BufferedRecv(b.recv, chunk=4096)
    reader = FrameReader(connection, recv)
    assert recv(0) == b""  # an empty read fills the buffer
    assert reader.read_frames(2) == 2  # the limit
    assert reader.read_frames(10) == 1  # then the partial frame
    assert connection.frames == frames
    assert not reader.ready()
    a.sendall(last[cut:])
    assert read_frame(recv) == last  # py-amqp's own read resumes at the partial frame


def test_read_frames_stops_when_enough(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b"".join(frame(3, 1, bytes([i])) for i in range(6)))
    connection = Dispatched()
    recv = BufferedRecv(b.recv, chunk=4096)
    reader = FrameReader(connection, recv)
    recv(0)
    assert reader.read_frames(100, lambda: len(connection.frames) >= 4) == 4
    assert reader.read_frames(100) == 2


def test_recv_never_returns_more_than_asked(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(bytes(range(200)))
    recv = BufferedRecv(b.recv, chunk=1024)
    assert recv(3) == bytes([0, 1, 2])
    assert recv(500) == bytes(range(3, 200))  # what is buffered, as socket.recv would


@pytest.mark.parametrize("limit", [1, 2, 96])  # a frame, less than a message, a burst
@pytest.mark.parametrize("bodies", [[b"a" * 2900] * 300 + [b"b" * 600_000] + [b"c" * 10] * 50])
def test_rabbitmq_messages_through_the_buffered_reader(
    rabbitmq_url: str, bodies: list[bytes], limit: int
) -> None:
    """Real broker framing: thousands of frames, one body split over many frames and
    larger than the buffer, read in bursts that end anywhere in a message; every message
    arrives whole and in order, and most of them came from the buffer (no recv, no
    timeout change)."""
    name = f"cellsight.test.reads.{uuid.uuid4().hex[:8]}"
    exchange = Exchange(name, type="direct", durable=False, auto_delete=True)
    queue = Queue(name, exchange, routing_key=name, durable=False, auto_delete=True)
    received: list[bytes] = []
    with Connection(rabbitmq_url) as conn:
        channel = conn.channel()
        queue(channel).declare()
        producer = Producer(conn.channel(), exchange=exchange)
        for body in bodies:
            producer.publish(body, routing_key=name, content_type="application/octet-stream")

        def on_message(message: Message) -> None:
            received.append(message.body)
            message.ack()

        with Consumer(channel, queues=[queue], on_message=on_message, prefetch_count=500):
            frames = buffered_frames(conn)
            assert frames is not None, "py-amqp's TCP transport should be buffered"
            from_buffer = bursts = 0
            while len(received) < len(bodies):
                if frames.ready():
                    read = frames.read_frames(limit)
                    assert 1 <= read <= limit
                    from_buffer += read
                    bursts += 1
                else:
                    conn.drain_events(timeout=10)
        queue(channel).delete()
    assert received == bodies
    assert from_buffer > len(bodies)  # frames (three or more per message) mostly buffered
    if limit > 1:
        assert bursts < from_buffer  # several frames per call


def test_bursts_of_empty_bodies_stop_at_the_messages_wanted(rabbitmq_url: str) -> None:
    """An empty body is two frames, not three: a burst sized for a number of messages
    stops at that number, as the consumer asks (``enough``), not at its frame budget."""
    name = f"cellsight.test.reads.{uuid.uuid4().hex[:8]}"
    exchange = Exchange(name, type="direct", durable=False, auto_delete=True)
    queue = Queue(name, exchange, routing_key=name, durable=False, auto_delete=True)
    received: list[bytes | str] = []
    bursts: list[int] = []
    with Connection(rabbitmq_url) as conn:
        channel = conn.channel()
        queue(channel).declare()
        producer = Producer(conn.channel(), exchange=exchange)
        for _ in range(60):
            producer.publish(b"", routing_key=name, content_type="application/octet-stream")

        def on_message(message: Message) -> None:
            received.append(message.body)
            message.ack()

        with Consumer(channel, queues=[queue], on_message=on_message, prefetch_count=100):
            frames = buffered_frames(conn)
            assert frames is not None
            while len(received) < 60:
                if frames.ready():
                    before = len(received)
                    target = before + 5

                    def enough(target: int = target) -> bool:
                        return len(received) >= target

                    frames.read_frames(3 * 5, enough)
                    bursts.append(len(received) - before)
                else:
                    conn.drain_events(timeout=10)
        queue(channel).delete()
    assert len(received) == 60 and not any(received)  # py-amqp gives '' for no body
    assert bursts and max(bursts) <= 5  # without ``enough``: up to 7 of 15 frames
    assert max(bursts) == 5  # and buffered messages did come five at a time


def test_the_consumer_fills_its_first_batch_exactly_from_a_burst(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    """The consumer asks a burst for the messages its batch has room for: with 40 empty
    bodies buffered (two frames each) and a batch of 5, the first batch planned holds 5
    (counted by frames, a burst of 15 would have read 7)."""
    tag = uuid.uuid4().hex[:8]
    config = ConsumerConfig(
        exchange=f"cellsight.test.burst.{tag}",
        queue=f"cellsight.test.burst.q.{tag}",
        dead_letter_exchange=f"cellsight.test.burst.dlx.{tag}",
        dead_letter_queue=f"cellsight.test.burst.dlq.{tag}",
        batch_count=5,
    )
    exchange = queues.notifications_exchange(config.exchange)
    planned: list[int] = []

    class Recording(IndexerConsumer):
        def _plan(self) -> Any:
            planned.append(len(self._batch))
            return super()._plan()

    engine = EmbeddedEngine(tmp_path / "index.db")
    try:
        with Connection(rabbitmq_url) as conn:
            queues.indexer_queue(config.queue, exchange)(conn.channel()).declare()
            producer = Producer(conn.channel(), exchange=exchange)
            for _ in range(40):
                producer.publish(b"", routing_key=queues.routing_key("INFO"))
        consumer = Recording(Connection(rabbitmq_url), engine, config)
        consumer.run(max_batches=1)
        assert planned[0] == 5
        assert consumer.totals["dead"] == 5  # not JSON: dead-lettered, then acked
    finally:
        engine.close()
        with Connection(rabbitmq_url) as conn, conn.channel() as channel:
            for q in (config.queue, config.dead_letter_queue):
                channel.queue_delete(q)
            for x in (config.exchange, config.dead_letter_exchange):
                channel.exchange_delete(x)


def test_other_transports_keep_their_own_reads() -> None:
    with Connection("memory://") as conn:
        conn.connect()
        assert buffered_frames(conn) is None
