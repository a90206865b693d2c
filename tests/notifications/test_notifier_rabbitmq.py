"""Notifier → RabbitMQ → a plain kombu consumer, and the ways a publish can fail."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kombu import Connection

from cellsight.notifications import queues
from cellsight.notifications.bus import open_bus
from cellsight.notifications.envelope import Notification, Priority
from cellsight.notifications.errors import PublishError
from cellsight.notifications.notifier import Notifier

pytestmark = pytest.mark.services

Exact = Callable[[list[tuple[str, dict[str, object]]], list[Notification]], None]


@pytest.fixture
def amqp(rabbitmq_url: str) -> Iterator[Connection]:
    with Connection(rabbitmq_url, connect_timeout=5) as connection:
        yield connection


@pytest.fixture
def names(amqp: Connection, unique: str) -> Iterator[tuple[str, str]]:
    """A unique exchange and queue name; both deleted afterwards."""
    exchange, queue = f"test.nova.{unique}", f"test.indexer.{unique}"
    yield exchange, queue
    channel = amqp.channel()
    try:
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        channel.close()


def test_every_message_delivered_exactly(
    rabbitmq_url: str,
    amqp: Connection,
    names: tuple[str, str],
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    exchange, queue_name = names
    queue = queues.indexer_queue(queue_name, exchange)
    sent = list(sample_notifications)
    priorities = {n.priority for n in sent}
    assert {Priority.INFO, Priority.ERROR} <= priorities

    bus = open_bus(rabbitmq_url, tmp_path / "bus")
    assert bus.url == rabbitmq_url and not bus.embedded
    with Notifier.on_bus(bus, exchange=exchange, declare_queues=[queue], timeout=5) as notifier:
        notifier.publish_many(sent[:10])
        for notification in sent[10:]:
            notifier.publish(notification)

    received = drain(amqp, queue, len(sent))
    exact(received, sent)
    assert {key for key, _ in received} == {
        "versioned_notifications.info",
        "versioned_notifications.error",
    }


def test_unroutable_message_raises_and_notifier_stays_usable(
    rabbitmq_url: str,
    amqp: Connection,
    names: tuple[str, str],
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    exchange, queue_name = names
    first, second = sample_notifications[:2]
    with Notifier(rabbitmq_url, exchange=exchange, timeout=5) as notifier:
        # The exchange exists (the notifier declares it) but no queue is bound.
        with pytest.raises(PublishError, match=r"not routed to any queue.*NO_ROUTE"):
            notifier.publish(first)

        queue = queues.indexer_queue(queue_name, exchange)
        queue(amqp.default_channel).declare()
        # The broker's ack that followed the return must not be taken for this confirm.
        notifier.publish(second)
    exact(drain(amqp, queue, 1), [second])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_dead_broker_raises_publish_error_in_bounded_time(
    sample_notifications: list[Notification],
) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{_closed_port()}//"
    notifier = Notifier(
        url,
        timeout=1.0,
        retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.1},
    )
    started = time.monotonic()
    with notifier, pytest.raises(PublishError, match="not delivered to exchange 'nova'"):
        notifier.publish(sample_notifications[0])
    assert time.monotonic() - started < 10


def test_declared_queue_holds_messages_for_a_later_consumer(
    rabbitmq_url: str,
    amqp: Connection,
    names: tuple[str, str],
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    exchange, queue_name = names
    queue = queues.indexer_queue(queue_name, exchange)
    sent = sample_notifications[:3]
    with Notifier(rabbitmq_url, exchange=exchange, declare_queues=[queue], timeout=5) as n:
        n.publish_many(sent)
    # The consumer declares the queue again, from the same function: RabbitMQ accepts it.
    exact(drain(amqp, queues.indexer_queue(queue_name, exchange), len(sent)), sent)


def test_a_connection_the_broker_closes_is_a_connection_error(
    amqp: Connection, names: tuple[str, str]
) -> None:
    """A publish whose connection the broker closes (here a header past its frame size)
    surfaces as the connection error it is, for the caller's reconnect and retry; the
    error handling once read the lost connection's error classes and raised
    ``AttributeError`` instead (the dead-letter publisher then stopped the indexer)."""
    from cellsight.notifications.confirm import (
        ConfirmingProducer,
        confirming_connection,
        publish_confirmed,
    )

    exchange_name, queue_name = names
    exchange = queues.notifications_exchange(exchange_name)
    queue = queues.indexer_queue(queue_name, exchange)
    with confirming_connection(amqp) as own:
        producer = ConfirmingProducer(own.channel())
        with pytest.raises(own.connection_errors):
            publish_confirmed(
                producer,
                b"{}",
                exchange=exchange,
                routing_key=queues.routing_key("info"),
                timeout=10.0,
                declare=[queue],
                headers={"pad": "x" * 140_000},
            )


def test_a_refused_login_is_named_as_the_connection_not_the_message(
    rabbitmq_url: str, names: tuple[str, str], tmp_path: Path, sample_notifications: list
) -> None:
    """A wrong password read as 'refused by exchange … with routing key …: the bus
    refused the message for routing key …' (a README probe)."""
    from urllib.parse import urlsplit, urlunsplit

    from cellsight.notifications.confirm import LoginRefused

    parts = urlsplit(rabbitmq_url)
    wrong = parts._replace(
        netloc=f"{parts.username}:not-the-password@{parts.hostname}:{parts.port}"
    )
    exchange, _ = names
    bus = open_bus(urlunsplit(wrong), tmp_path / "bus")
    with (
        Notifier.on_bus(bus, exchange=exchange, timeout=5) as notifier,
        pytest.raises(LoginRefused) as refused,
    ):
        notifier.publish(sample_notifications[0])
    message = str(refused.value)
    assert "the bus refused the connection" in message and "ACCESS_REFUSED" in message
    assert "refused the message" not in message and "not-the-password" not in message
