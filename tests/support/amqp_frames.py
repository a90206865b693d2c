"""AMQP frames for the delivery router's tests (``cellsight.indexer.amqp_deliveries``):
a delivery's frames built with py-amqp's own serializers, and stand-ins for the channel
and the connection (py-amqp's own frame handler behind it) that the router touches."""

from __future__ import annotations

import struct
from typing import Any

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.method_framing import frame_handler
from amqp.serialization import dumps

from cellsight.indexer.amqp_deliveries import BODY, HEADER, METHOD

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
