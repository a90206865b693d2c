"""What crosses between the consumer and its writer process (``write_process``).

Each planned document crosses as msgpack bytes (pickling the planned objects cost 20-50 µs
a document each way; msgpack 3-10 µs), each verdict as a tuple of plain values.
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.outcomes import Outcome, Verdict
from cellsight.indexer.planning import EventInfo, Planned

PIPE_BYTES = 4 << 20  # socket buffers (capped by the OS): fewer system calls per batch

_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder()

# (position, resource, id, version, document as msgpack (or the dict itself when msgpack
# cannot carry it), event type, notification time, snapshot time)
WirePlanned = tuple[int, str, str, int, bytes | dict[str, Any], str, datetime | None, Any]
WireOutcome = tuple[str, str | None, str | None, str | None, str | None, float | None]


def encode_planned(p: Planned) -> WirePlanned:
    document: bytes | dict[str, Any]
    try:
        document = _ENCODE.encode(p.op.document)
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
        # An integer past 64 bits or a lone surrogate: pickle carries it, and the engine
        # decides about it as it would in-process.
        document = p.op.document
    info = p.notification
    return (p.position, p.op.resource, p.op.id, p.op.version, document, info.event_type,
            info.timestamp, p.snapshot_at)  # fmt: skip


def decode_planned(wire: WirePlanned) -> Planned:
    position, resource, doc_id, version, document, event_type, timestamp, snapshot_at = wire
    doc = _DECODE.decode(document) if isinstance(document, bytes) else document
    op = WriteOp(resource, doc_id, version, doc)
    return Planned(position, op, EventInfo(event_type, timestamp), snapshot_at)


def encode_outcome(o: Outcome) -> WireOutcome:
    return (o.verdict.value, o.reason_code, o.reason, o.event_type, o.resource, o.lag)


def decode_outcome(wire: WireOutcome) -> Outcome:
    verdict, code, reason, event_type, resource, lag = wire
    return Outcome(Verdict(verdict), code, reason, event_type, resource=resource, lag=lag)


def widen(conn: Connection) -> None:
    """A duplex ``Pipe`` is a Unix socket pair; wider buffers mean fewer system calls."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    with sock, contextlib.suppress(OSError):  # capped by the OS: only slower
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BYTES)
