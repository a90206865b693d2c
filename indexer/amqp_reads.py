"""AMQP frames read from a buffer: one ``recv`` for many messages, no timeout changes.

py-amqp reads every frame with its own ``recv`` calls (header, payload, end octet: three
to six per message) and ``drain_events(timeout=…)`` sets the socket's timeout and
restores it around every message. Each of those calls releases the GIL, and while a
writer thread is busy the consumer then waits up to the interpreter's switch interval to
get it back: profiled on the indexer (py-spy, RabbitMQ, 10,000 notifications), a quarter
of the consumer thread's time was spent in ``settimeout`` and a third in ``recv``.

:func:`buffered_frames` swaps the transport's receive function for :class:`BufferedRecv`
(one ``recv`` of up to 256 KiB, served in the sizes py-amqp asks for) and returns a
:class:`FrameReader` that dispatches frames already in that buffer, a burst at a time,
without touching the socket. When the buffer holds no whole frame the consumer falls
back to the ordinary ``drain_events`` with its timeout, so an idle or slow bus behaves
exactly as before.

Only py-amqp's plain TCP transport is changed; TLS (whose socket buffers by itself) and
other transports (the embedded bus's Redis) get ``None`` and keep kombu's own reads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from amqp.exceptions import UnexpectedFrame
from kombu import Connection

CHUNK = 256 * 1024
FRAME_HEADER = 7  # type (1), channel (2), payload size (4)
FRAME_END = 1
FRAME_END_OCTET = 0xCE
_HEADER = struct.Struct(">BHI")


class BufferedRecv:
    """A stand-in for ``socket.recv``: returns at most ``n`` bytes, read from the socket
    ``chunk`` bytes at a time. It never returns more than asked, so py-amqp's own
    frame reader (which keeps partial reads across timeouts) works unchanged."""

    def __init__(self, recv: Callable[[int], bytes], chunk: int = CHUNK) -> None:
        self._recv = recv
        self._chunk = chunk
        self._buffer = b""
        self._position = 0

    def __call__(self, n: int) -> bytes:
        if self._position >= len(self._buffer):
            self._buffer = self._recv(max(n, self._chunk))
            self._position = 0
        start = self._position
        part = self._buffer[start : start + n]
        self._position = start + len(part)
        return part

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._position

    def whole_frame(self) -> bool:
        """Whether the buffer starts with a complete frame (header, payload, end)."""
        start = self._position
        if len(self._buffer) - start < FRAME_HEADER:
            return False
        size = _HEADER.unpack_from(self._buffer, start)[2]
        return len(self._buffer) - start >= FRAME_HEADER + size + FRAME_END

    def take_frame(self) -> tuple[int, int, bytes] | None:
        """The whole frame at the start of the buffer as py-amqp's ``read_frame`` returns
        it (type, channel, payload), or None when the buffer does not hold all of it. One
        slice, where py-amqp asks for the header, the payload and the end octet
        separately, each through its own buffer and this object's ``__call__``."""
        start = self._position
        buffer = self._buffer
        if len(buffer) - start < FRAME_HEADER:
            return None
        frame_type, channel, size = _HEADER.unpack_from(buffer, start)
        end = start + FRAME_HEADER + size
        if len(buffer) <= end:
            return None
        if buffer[end] != FRAME_END_OCTET:
            raise UnexpectedFrame(f"Received frame_end {buffer[end]:#04x} while expecting 0xce")
        self._position = end + FRAME_END
        return frame_type, channel, buffer[start + FRAME_HEADER : end]


class FrameReader:
    def __init__(self, amqp_connection: Any, recv: BufferedRecv) -> None:
        self._connection = amqp_connection
        self._transport = amqp_connection.transport
        self._recv = recv

    def ready(self) -> bool:
        """A whole frame is buffered and py-amqp holds no partial one of its own (after a
        timeout mid-frame it keeps the bytes read so far; the next frame starts there)."""
        return not self._transport._read_buffer and self._recv.whole_frame()

    def read_frames(self, limit: int, enough: Callable[[], bool] | None = None) -> int:
        """Dispatch up to ``limit`` buffered frames, stopping at the first one not wholly
        buffered, or as soon as ``enough()`` says so after a frame; returns how many. No
        syscall, no timeout change (call after :meth:`ready`). A message's last frame
        runs the consumer's callback: ``enough`` can count messages, whose frames vary
        (an empty body has none, a large one several).

        This is py-amqp's ``blocking_read(None)`` without its ``having_timeout``
        context manager, which for no timeout only yields the socket (a generator
        context per frame, three frames a message: about 1.5 µs of the consumer's CPU
        per notification), with each frame cut from the buffer at once instead of by
        ``read_frame``'s three reads (``BufferedRecv.take_frame``), and many frames per
        call: the consumer's loop runs once per burst, not once per message."""
        take, dispatch = self._recv.take_frame, self._connection.on_inbound_frame
        done = 0
        while done < limit:
            frame = take()
            if frame is None:
                break
            dispatch(frame)
            done += 1
            if enough is not None and enough():
                break
        return done


def py_amqp(connection: Connection) -> Any | None:
    """The py-amqp connection under ``connection``, or None for another transport (the
    embedded bus's Redis, librabbitmq)."""
    from amqp import Connection as AmqpConnection

    amqp_connection = connection.connection if connection.transport.driver_type == "amqp" else None
    # librabbitmq's transport is "amqp" too, without py-amqp's frame handler.
    return amqp_connection if isinstance(amqp_connection, AmqpConnection) else None


def bound_closing(connection: Connection, seconds: float) -> None:
    """Reads on ``connection``'s socket time out after ``seconds``: its closing
    handshakes (cancel-ok, channel close-ok) waited without end on a broker gone silent,
    the worker deaf to SIGTERM (a review). A timeout is a lost connection, let go of."""
    amqp_connection = py_amqp(connection)
    sock = getattr(getattr(amqp_connection, "transport", None), "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def tcp_connection(connection: Connection) -> Any | None:
    """The py-amqp connection under ``connection`` if it runs over plain TCP (not TLS),
    else None."""
    from amqp.transport import TCPTransport

    amqp_connection = py_amqp(connection)
    if type(getattr(amqp_connection, "transport", None)) is not TCPTransport:
        return None
    return amqp_connection


def buffered_frames(connection: Connection) -> FrameReader | None:
    """Install :class:`BufferedRecv` on an established py-amqp TCP connection (once) and
    return its reader; ``None`` for any other transport."""
    amqp_connection = tcp_connection(connection)
    if amqp_connection is None:
        return None
    transport = amqp_connection.transport
    if not hasattr(transport, "_quick_recv"):
        return None
    recv = transport._quick_recv
    if not isinstance(recv, BufferedRecv):
        recv = BufferedRecv(recv)
        transport._quick_recv = recv
    return FrameReader(amqp_connection, recv)
