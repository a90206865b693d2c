"""The one declaration of the bus topology: exchanges, queues and bindings.

Producers and consumers both declare what they use, and RabbitMQ refuses a second
declaration whose arguments differ from the first (``PRECONDITION_FAILED``). Building
every entity here, from names passed in, keeps the declarations identical everywhere.

The dead-letter exchange is a topic exchange rather than a fanout one: kombu's Redis
transport implements fanout with Redis PUB/SUB, which keeps nothing for a consumer
that is not listening, while topic and direct exchanges push onto Redis lists.
"""

from __future__ import annotations

from collections.abc import Callable

from kombu import Exchange, Queue

from cellsight.notifications.envelope import Priority

DEFAULT_EXCHANGE = "nova"
DEFAULT_INDEXER_QUEUE = "cellsight.indexer"
DEFAULT_DEAD_LETTER_EXCHANGE = "cellsight.dlx"
DEFAULT_DEAD_LETTER_QUEUE = "cellsight.dlq"

TOPIC = "versioned_notifications"
ALL_PRIORITIES = f"{TOPIC}.*"
"""Binding key matching every ``versioned_notifications.<priority>`` routing key."""

EVERYTHING = "#"

PERSISTENT = 2
"""AMQP delivery mode: the broker writes the message to disk (durable queues only)."""


def routing_key(priority: Priority | str) -> str:
    """``versioned_notifications.<priority lower>``, as oslo.messaging routes them."""
    return Priority.parse(priority).routing_key


def notifications_exchange(name: str = DEFAULT_EXCHANGE, *, durable: bool = True) -> Exchange:
    """The topic exchange notifications are published to.

    ``durable`` must match an exchange that already exists on the broker: Nova's own
    oslo.messaging declares ``nova`` non-durable unless ``amqp_durable_queues`` is set,
    so sharing a RabbitMQ with Nova may need ``durable=False``.
    """
    return Exchange(
        name, type="topic", durable=durable, auto_delete=False, delivery_mode=PERSISTENT
    )


def indexer_queue(
    name: str = DEFAULT_INDEXER_QUEUE, exchange: str | Exchange = DEFAULT_EXCHANGE
) -> Queue:
    """The durable queue the indexer consumes, bound to every notification priority.

    It carries no ``x-dead-letter-exchange`` argument on purpose: the consumer moves a
    rejected message to the dead-letter exchange itself, with the reason in its
    headers, which works the same on RabbitMQ and Redis; and a queue argument that one
    declarer sets and another omits makes RabbitMQ refuse the second declaration.
    """
    return Queue(
        name,
        exchange=_exchange(exchange, notifications_exchange),
        routing_key=ALL_PRIORITIES,
        durable=True,
        auto_delete=False,
        exclusive=False,
    )


def dead_letter_exchange(name: str = DEFAULT_DEAD_LETTER_EXCHANGE) -> Exchange:
    return Exchange(name, type="topic", durable=True, auto_delete=False, delivery_mode=PERSISTENT)


def dead_letter_queue(
    name: str = DEFAULT_DEAD_LETTER_QUEUE, exchange: str | Exchange = DEFAULT_DEAD_LETTER_EXCHANGE
) -> Queue:
    """The durable queue holding every rejected notification, whatever its routing key."""
    return Queue(
        name,
        exchange=_exchange(exchange, dead_letter_exchange),
        routing_key=EVERYTHING,
        durable=True,
        auto_delete=False,
        exclusive=False,
    )


def _exchange(exchange: str | Exchange, build: Callable[[str], Exchange]) -> Exchange:
    # An Exchange passed in was built by this module; a name is built the same way.
    return exchange if isinstance(exchange, Exchange) else build(exchange)
