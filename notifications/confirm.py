"""Confirmed publishing: a message counts as delivered only when the bus says it queued it.

- RabbitMQ: the channel is in publisher-confirm mode and every publish is ``mandatory``.
  The broker answers with an ack, a nack (e.g. a full ``reject-publish`` queue), or a
  ``basic.return`` followed by an ack when no queue is bound to the routing key; only
  a plain ack counts.
- Redis (the embedded bus): kombu routes a topic exchange itself from the bindings
  stored in Redis and silently drops a message matching none, so the bindings are
  looked up before publishing. The push itself is a synchronous Redis command: its
  reply (or error, e.g. ``OOM`` under ``maxmemory``) is the confirmation.

Used by the ``Notifier`` (producers), the indexer's dead-letter handoff and
``dlq replay``, which all ack or commit something only after a confirmed publish.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqp.exceptions import MessageNacked
from kombu import Connection, Exchange, Producer, Queue
from kombu.transport import virtual

from cellsight.notifications.bus import refused
from cellsight.notifications.errors import PublishError
from cellsight.notifications.queues import PERSISTENT

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


class Unroutable(PublishError):
    """The bus routed the message to no queue (nothing bound to its routing key)."""

    reason = "unroutable"


class Refused(PublishError):
    """The broker negatively acknowledged the message (a queue refused it)."""

    reason = "refused"


class LoginRefused(Refused):
    """The bus turned the connection away (``bus.refused``: its user, password or
    virtual host) before any message was sent: nothing about the message is at fault."""

    reason = "login_refused"


def is_amqp(url: str) -> bool:
    return url.partition("://")[0].lower() in AMQP_SCHEMES


def confirming_connection(connection: Connection) -> Connection:
    """A new connection like ``connection`` whose AMQP channels are in confirm mode."""
    options = dict(connection.transport_options or {})
    if connection.transport.driver_type == "amqp":
        options["confirm_publish"] = True
    return connection.clone(transport_options=options)


class ConfirmingProducer(Producer):
    """A producer that records the broker's ``basic.return`` for the message in flight.

    Registering a handler keeps py-amqp from raising inside its confirm wait, which
    would leave the ack that follows the return unread on the channel, to be taken
    later for the confirm of the next message.
    """

    def __init__(self, channel: Any, *, watch_returns: bool | None = None) -> None:
        self.returned: list[str] = []
        if watch_returns is None:
            watch_returns = not isinstance(channel, virtual.Channel)
        # Virtual transports (Redis) have no ``basic.return`` and no channel events.
        super().__init__(channel, on_return=self._on_return if watch_returns else None)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self.returned.append(f"{exc} (exchange {exchange!r}, routing key {routing_key!r})")


def routable(channel: Any, exchange: str, key: str) -> bool:
    """Whether a virtual (Redis) channel would route ``key`` on ``exchange`` to a queue."""
    try:
        table: Iterable[Any] = channel.get_table(exchange)
    except KeyError:  # no binding was ever stored for this exchange
        return False
    return bool(channel.typeof(exchange).lookup(table, exchange, key, None))


def log_in(producer: ConfirmingProducer) -> tuple[type[BaseException], ...]:
    """Connect and log in now, if not yet; returns the connection's channel errors.
    Raises ``LoginRefused`` when the bus turns the login away."""
    # Read before: a connection the broker closed meanwhile leaves the producer without one.
    channel_errors: tuple[type[BaseException], ...] = producer.connection.channel_errors
    try:
        producer.channel  # noqa: B018 - connects and logs in now, if not yet
    except channel_errors as exc:
        # A refused login is one of py-amqp's channel errors: it was read as the message
        # refused for its routing key (an operator's wrong password).
        refusal = login_refused(exc)
        if refusal is not None:
            raise refusal from exc
        raise
    return channel_errors


def login_refused(exc: BaseException) -> LoginRefused | None:
    """``LoginRefused`` if ``exc``, or what it was raised from (kombu wraps Redis's
    refusal in its ``OperationalError``), is the bus turning the login away."""
    seen: BaseException | None = exc
    while seen is not None:
        if refused(seen, consumed=False):
            return LoginRefused(
                "the bus refused the connection (check the user, password and virtual "
                f"host of bus_url): {type(seen).__name__}: {seen}"
            )
        seen = seen.__cause__
    return None


def publish_confirmed(
    producer: ConfirmingProducer,
    body: Any,
    *,
    exchange: Exchange,
    routing_key: str,
    timeout: float,
    declare: Iterable[Exchange | Queue] = (),
    **properties: Any,
) -> None:
    """Publish once and return only when the bus confirmed it queued the message.

    Raises ``Unroutable`` or ``Refused``; connection errors propagate unchanged, for the
    caller's retry (kombu's ``ensure``) or its own reconnect.
    """
    channel_errors = log_in(producer)
    try:
        _publish(producer, body, exchange, routing_key, timeout, declare, properties)
    except MessageNacked as exc:
        raise Refused(
            f"the broker refused the message for routing key {routing_key!r} on exchange "
            f"{exchange.name!r} (nack)"
        ) from exc
    except channel_errors as exc:
        # e.g. Redis ``OOM`` under ``maxmemory`` or ``WRONGTYPE``, a missing exchange on
        # RabbitMQ: the bus answered, and refused.
        raise Refused(
            f"the bus refused the message for routing key {routing_key!r} on exchange "
            f"{exchange.name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if producer.returned:
        raise Unroutable("; ".join(producer.returned))


def _publish(
    producer: ConfirmingProducer,
    body: Any,
    exchange: Exchange,
    routing_key: str,
    timeout: float,
    declare: Iterable[Exchange | Queue],
    properties: dict[str, Any],
) -> None:
    for entity in (exchange, *declare):
        producer.maybe_declare(entity)
    channel = producer.channel
    if isinstance(channel, virtual.Channel) and not routable(channel, exchange.name, routing_key):
        raise Unroutable(
            f"no queue is bound to routing key {routing_key!r} on exchange {exchange.name!r}"
        )
    producer.returned.clear()
    properties.setdefault("delivery_mode", PERSISTENT)
    producer.publish(
        body,
        exchange=exchange,
        routing_key=routing_key,
        mandatory=True,
        timeout=timeout,
        confirm_timeout=timeout,
        **properties,
    )
