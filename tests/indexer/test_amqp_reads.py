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

import pytest
from amqp.exceptions import UnexpectedFrame
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Message, Producer, Queue

from cellsight.indexer.amqp_reads import FRAME_END, FRAME_HEADER, BufferedRecv, buffered_frames


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
            if recv.whole_frame():
                got.append(recv.take_frame())
            else:
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


def test_other_transports_keep_their_own_reads() -> None:
    with Connection("memory://") as conn:
        conn.connect()
        assert buffered_frames(conn) is None
