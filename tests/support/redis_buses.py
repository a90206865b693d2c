"""A Redis bus for the tests of Cellsight's Redis transport
(``notifications.redis_landing``): the embedded bus or a Redis server of its own
(``redis://``, under a key prefix), with a plain client beside the kombu connections,
and a live consumer that keeps and acks what it receives.

The ``redis_bus`` fixture is ``redis_bus_fixture``, registered by tests/notifications' conftest."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from cellsight.clients import build_bus
from cellsight.notifications.unreadable import kombu_url
from cellsight.settings import load_settings


@dataclass
class RedisBus:
    url: str
    client: redis.Redis
    prefix: str  # the connections' global key prefix ("" on the embedded bus)

    def connection(self, **options: Any) -> Connection:
        # A live consumer scans for what to restore at every idle cycle (kombu: every 10th).
        opts: dict[str, Any] = {"visibility_timeout": 1, "unacked_restore_throttle": 1}
        if self.prefix:
            opts["global_keyprefix"] = self.prefix
        return Connection(kombu_url(self.url), transport_options=opts | options)

    def keys(self, pattern: str) -> list[bytes]:
        return list(self.client.scan_iter(f"{self.prefix}{pattern}"))


@pytest.fixture(params=["embedded", "redis"], name="redis_bus")
def redis_bus_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisBus]:
    if request.param == "embedded":
        with build_bus(load_settings(data_dir=tmp_path)) as bus:
            assert bus.server is not None
            client = redis.Redis(unix_socket_path=str(bus.server.socket))
            yield RedisBus(bus.url, client, "")
            client.close()
        return
    url = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url)
    prefix = f"t-landing-{uuid.uuid4().hex[:10]}:"
    yield RedisBus(url, client, prefix)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


def a_queue() -> Queue:
    name = f"q-{uuid.uuid4().hex[:10]}"
    return Queue(name, Exchange(name, "direct"), name)


def publish(bus: RedisBus, queue: Queue, bodies: list[str], **options: Any) -> None:
    with bus.connection() as conn:
        producer = conn.Producer()
        for body in bodies:
            producer.publish(
                body, exchange=queue.exchange, routing_key=queue.routing_key,
                declare=[queue], **options,
            )  # fmt: skip


class Acking:
    """A consumer's callback that keeps each body (``got``) and acks it."""

    def __init__(self) -> None:
        self.got: list[str] = []

    def __call__(self, body: Any, message: Any) -> None:
        self.got.append(body)
        message.ack()

    def drain(self, conn: Connection, count: int, within: float, *errors: type) -> None:
        """Drains ``conn`` until ``count`` bodies are kept or ``within`` seconds pass
        (``errors``: what else a read may raise and the drain goes on after)."""
        deadline = time.monotonic() + within
        while len(self.got) < count and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError, *errors):
                conn.drain_events(timeout=0.5)


def drain(bus: RedisBus, queue: Queue | list[Queue], count: int, within: float) -> list[str]:
    """What a live consumer receives (and acks), until ``count`` or ``within`` seconds."""
    take = Acking()
    queues = queue if isinstance(queue, list) else [queue]
    with bus.connection() as conn, conn.Consumer(queues, callbacks=[take]):
        take.drain(conn, count, within)
    return take.got


def unacked(bus: RedisBus) -> int:
    return int(bus.client.hlen(f"{bus.prefix}unacked"))
