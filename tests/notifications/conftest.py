"""Fixtures of the notification tests: the samples, unique bus names, a plain kombu reader."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Consumer, Message, Queue

from cellsight.notifications.envelope import Notification, decode
from cellsight.notifications.notifier import stamped
from tests.support.redis_buses import redis_bus_fixture  # noqa: F401  (fixture redis_bus)

Received = list[tuple[str, dict[str, Any]]]
"""(routing key, JSON body) per message, in delivery order."""

Drain = Callable[[Connection, Queue, int], Received]


@pytest.fixture
def nova_sample_paths(samples_dir: Path) -> list[Path]:
    """Nova's own samples: the conformance tests."""
    paths = sorted(samples_dir.glob("*.json"))
    assert len(paths) >= 15
    return paths


@pytest.fixture
def sample_paths(nova_like_dir: Path) -> list[Path]:
    """Generated notifications named like Nova's samples (``tests.support.novagen``)."""
    paths = sorted(nova_like_dir.glob("*.json"))
    assert len(paths) >= 15
    return paths


@pytest.fixture
def sample_notifications(sample_paths: list[Path]) -> list[Notification]:
    """Every sample, stamped as the notifier would send it, so bodies compare exactly."""
    return [stamped(decode(path.read_bytes())) for path in sample_paths]


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


def drain_queue(
    connection: Connection,
    queue: Queue,
    expected: int,
    timeout: float = 10.0,
    settle: float = 0.3,
) -> Received:
    """Read and ack until ``expected`` messages arrived, then ``settle`` seconds more so
    that a duplicate would be seen too."""
    received: Received = []

    def on_message(body: Any, message: Message) -> None:
        received.append((message.delivery_info["routing_key"], json.loads(message.body)))
        message.ack()

    deadline = time.monotonic() + timeout
    with Consumer(connection, [queue], callbacks=[on_message], accept=["json"]):
        while time.monotonic() < deadline:
            if len(received) >= expected:
                deadline = min(deadline, time.monotonic() + settle)
            try:
                connection.drain_events(timeout=0.2)
            except TimeoutError:
                continue
    return received


@pytest.fixture
def drain() -> Drain:
    return drain_queue


def assert_exact(received: Received, sent: list[Notification]) -> None:
    """Every message once, in order, exactly the oslo wrapper that was sent."""
    assert len(received) == len(sent)
    assert [key for key, _ in received] == [n.priority.routing_key for n in sent]
    assert [body for _, body in received] == [n.to_oslo() for n in sent]
    assert [decode(body).to_dict() for _, body in received] == [n.to_dict() for n in sent]


@pytest.fixture
def exact() -> Callable[[Received, list[Notification]], None]:
    return assert_exact
