"""The benchmarks' prepublish survives a connection the broker drops mid-way: it reopens
and resumes after what the queue holds, so the queue ends with every body once, in
order (a million-message run lost its connection at 842,000 and the bench died)."""

from __future__ import annotations

import importlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from tests.support.services import rabbitmq_names

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bus(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the benchmarks import ``bench.*``
    return importlib.import_module("bench.bus")


@pytest.fixture
def topo(bus: Any, rabbitmq_url: str) -> Iterator[Any]:
    """A bench topology of the test's own on the real broker, deleted afterwards."""
    topo = bus.Topology.fresh("prepublish-test")
    rabbitmq_names(queues=[topo.queue, topo.dlq], exchanges=[topo.exchange, topo.dlx])
    yield topo
    topo.delete(rabbitmq_url)


def _drain(url: str, queue: str) -> list[bytes]:
    bodies = []
    with Connection(url) as conn, conn.channel() as ch:
        while (message := ch.basic_get(queue, no_ack=True)) is not None:
            body = message.body  # py-amqp decodes a utf-8 body to text
            bodies.append(body.encode() if isinstance(body, str) else bytes(body))
    return bodies


def _cut_connections(bus: Any, monkeypatch: pytest.MonkeyPatch, at: set[int]) -> list[int]:
    """The publisher's connection lost right after its publish number in ``at`` (once
    each): its socket shut down, as when the broker closed it, so py-amqp raises its own
    error at the next read. Returns the publish numbers it was cut at."""
    publish = bus.ConfirmingPublisher.publish
    cut: list[int] = []

    def publish_then_cut(self: Any, body: bytes) -> None:
        publish(self, body)
        if self.sent in at:
            at.discard(self.sent)
            cut.append(self.sent)
            self.conn.connection.sock.shutdown(socket.SHUT_RDWR)

    monkeypatch.setattr(bus.ConfirmingPublisher, "publish", publish_then_cut)
    return cut


def test_prepublish_resumes_after_a_lost_connection(
    bus: Any, topo: Any, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [f'{{"n": {i}}}'.encode() for i in range(60)]
    cut = _cut_connections(bus, monkeypatch, {37})
    bus.prepublish(rabbitmq_url, topo, bodies, group=10)
    assert cut == [37]  # the connection was lost once, mid-way
    assert _drain(rabbitmq_url, topo.queue) == bodies  # each once, in order


def test_prepublish_gives_up_after_its_attempts(
    bus: Any, topo: Any, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each attempt loses its connection (the first after one publish, the second after two).
    cut = _cut_connections(bus, monkeypatch, {1, 2})
    with pytest.raises(Connection(rabbitmq_url).connection_errors):
        bus.prepublish(rabbitmq_url, topo, [b"{}"] * 5, group=1, attempts=2)
    assert cut == [1, 2]
