"""The producer library: publish notifications onto the bus, or raise ``PublishError``.

Guarantees, per transport:

- RabbitMQ (``amqp://``): publisher confirms (``confirm_publish``) and ``mandatory``.
  The broker answers every message with an ack, a nack, or a ``basic.return`` followed
  by an ack when no queue is bound to its routing key; only a plain ack counts as
  delivered. Messages are persistent.
- Redis (the embedded bus): kombu's Redis transport routes a topic exchange itself,
  reading the bindings from Redis, and a message matching no binding is dropped without
  a word (RabbitMQ would do the same without ``mandatory``). So the notifier looks up
  the bindings before publishing and raises ``PublishError`` when none matches, the
  same outcome as a returned mandatory message. ``declare_queues`` avoids that case:
  declare the indexer queue and messages wait in it until the indexer first starts.

Connection errors are retried a bounded number of times (kombu's ``ensure``); every
other failure is raised at once. Nothing here imports the rest of Cellsight.
"""

from __future__ import annotations

import contextlib
import functools
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypedDict

from kombu import Connection, Exchange, Queue
from kombu.pools import ProducerPool

from cellsight.notifications.bus import Bus
from cellsight.notifications.confirm import (
    AMQP_SCHEMES,
    ConfirmingProducer,
    LoginRefused,
    Refused,
    Unroutable,
    log_in,
    login_refused,
    publish_confirmed,
)
from cellsight.notifications.envelope import Notification
from cellsight.notifications.errors import PublishError
from cellsight.notifications.publisher import Publisher
from cellsight.notifications.queues import DEFAULT_EXCHANGE, notifications_exchange
from cellsight.notifications.unreadable import kombu_url
from cellsight.urls import redact_urls


class RetryPolicy(TypedDict, total=False):
    """kombu's ``Connection.ensure`` keywords; applied to connection errors only."""

    max_retries: int
    interval_start: float
    interval_step: float
    interval_max: float


DEFAULT_RETRY_POLICY: RetryPolicy = {
    "max_retries": 3,
    "interval_start": 0.0,
    "interval_step": 0.5,
    "interval_max": 2.0,
}


class Notifier:
    """Publishes notifications to the topic exchange, one routing key per priority.

    ``declare_queues`` are declared (with their bindings) before the first publish on
    each connection, so their messages are kept until a consumer first reads them.
    ``timeout`` bounds each connect, publish and confirm wait; with the retry policy
    the worst case for one publish is about ``(max_retries + 1) * timeout``.
    ``on_close`` runs after the connections are closed (e.g. to release the bus).
    """

    def __init__(
        self,
        url: str,
        *,
        transport_options: dict[str, Any] | None = None,
        exchange: str = DEFAULT_EXCHANGE,
        exchange_durable: bool = True,
        timeout: float = 10.0,
        retry_policy: RetryPolicy | None = None,
        declare_queues: Sequence[Queue] = (),
        pool_limit: int = 4,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.exchange = notifications_exchange(exchange, durable=exchange_durable)
        self.timeout = timeout
        self.retry_policy: RetryPolicy = {**DEFAULT_RETRY_POLICY, **(retry_policy or {})}
        self._declare: list[Exchange | Queue] = [self.exchange, *declare_queues]
        self._on_close = on_close
        self._amqp = url.partition("://")[0].lower() in AMQP_SCHEMES
        options: dict[str, Any] = {
            **(transport_options or {}),
            # kombu reads these when it (re)connects outside ``ensure``: unbounded otherwise.
            **self.retry_policy,
            "connect_retries_timeout": timeout,
        }
        if self._amqp:
            options["confirm_publish"] = True
        self._url = url
        # Cellsight's Redis transport for a Redis URL, as ``Bus.connection``: its client
        # tells a server that cannot persist for now (``redis_refusals``) from a refusal.
        self._connection = Connection(
            kombu_url(url), transport_options=options, connect_timeout=timeout
        )
        self._producers = ProducerPool(
            self._connection.Pool(limit=pool_limit),
            limit=pool_limit,
            Producer=functools.partial(ConfirmingProducer, watch_returns=self._amqp),
        )
        self._closed = False

    @classmethod
    def on_bus(cls, bus: Bus, *, close_bus: bool = True, **kwargs: Any) -> Notifier:
        """A notifier for ``bus``; with ``close_bus`` closing it releases the bus too."""
        return cls(
            bus.url,
            transport_options=bus.transport_options,
            on_close=bus.close if close_bus else None,
            **kwargs,
        )

    @property
    def target(self) -> str:
        return f"exchange {self.exchange.name!r} on {redact_urls(self._url)}"

    def publish(self, notification: Notification) -> None:
        self.publish_many([notification])

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        """Publish in order; each is confirmed before the next (py-amqp confirms one by one).

        On failure the error says how many were delivered before it; those stay
        delivered (a retry publishes them again, which consumers must tolerate).
        """
        if not notifications and not self._closed:
            return
        with self._producer() as producer:
            for done, notification in enumerate(notifications):
                self._publish_one(producer, notification, done, len(notifications))

    def check(self) -> None:
        """Connect, log in and declare the exchange and queues now, as the first publish
        would: a relay with nothing to publish finds a wrong URL, password or permission
        at its start, not hours later with its first notification. Raises
        ``LoginRefused``, ``Refused`` (a declaration turned away) or ``PublishError``."""

        def attempt() -> None:
            log_in(producer)
            for entity in self._declare:
                producer.maybe_declare(entity)

        with self._producer() as producer:
            channel_errors: tuple[type[BaseException], ...] = producer.connection.channel_errors
            try:
                producer.connection.ensure(producer, attempt, **self.retry_policy)()
            except LoginRefused as exc:
                raise LoginRefused(f"cannot publish to {self.target}: {exc}") from None
            except channel_errors as exc:
                raise Refused(
                    f"{self.target} refused its declarations: {type(exc).__name__}: {exc}"
                ) from None
            except Exception as exc:
                refusal = login_refused(exc)
                if refusal is not None:
                    raise LoginRefused(f"cannot publish to {self.target}: {refusal}") from None
                raise PublishError(
                    f"no connection to {self.target}: {type(exc).__name__}: {exc}"
                ) from exc

    @contextlib.contextmanager
    def _producer(self) -> Iterator[ConfirmingProducer]:
        """A producer of the pool, given back after use."""
        if self._closed:
            raise PublishError("the notifier is closed")
        try:
            producer = self._producers.acquire(block=True, timeout=self.timeout)
        except Exception as exc:
            raise PublishError(f"no connection to {self.target}: {exc}") from exc
        try:
            yield producer
        except BaseException:
            # A confirm or reply may still be in flight; a fresh connection cannot
            # mistake it for the answer to the next message.
            with contextlib.suppress(Exception):
                producer.connection.collect()
            raise
        finally:
            self._producers.release(producer)

    def _publish_one(
        self, producer: ConfirmingProducer, notification: Notification, done: int, total: int
    ) -> None:
        notification = stamped(notification)
        key = notification.priority.routing_key
        body = notification.to_oslo()

        def attempt() -> None:
            publish_confirmed(
                producer,
                body,
                exchange=self.exchange,
                routing_key=key,
                timeout=self.timeout,
                declare=self._declare[1:],
                serializer="json",
                message_id=notification.message_id,
            )

        what = f"{notification.event_type} {notification.message_id}"
        where = f"{self.target} with routing key {key!r}"
        before = f" ({done} of {total} delivered before it)" if total > 1 else ""
        try:
            producer.connection.ensure(producer, attempt, **self.retry_policy)()
        except Unroutable as exc:
            raise Unroutable(f"{what} not routed to any queue by {where}: {exc}{before}") from None
        except LoginRefused as exc:
            raise LoginRefused(f"{what} not delivered to {where}: {exc}{before}") from None
        except Refused as exc:
            raise Refused(f"{what} refused by {where}: {exc}{before}") from None
        except Exception as exc:
            raise PublishError(
                f"{what} not delivered to {where}: {type(exc).__name__}: {exc}{before}"
            ) from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._producers.force_close_all()
            self._producers.connections.force_close_all()
            self._connection.release()
        finally:
            if self._on_close is not None:
                self._on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def stamped(notification: Notification) -> Notification:
    """The notification with ``message_id`` and ``timestamp`` set, as oslo.messaging sends it."""
    update: dict[str, Any] = {}
    if notification.message_id is None:
        update["message_id"] = str(uuidlib.uuid4())
    if notification.timestamp is None:
        update["timestamp"] = datetime.now(UTC)
    return notification.model_copy(update=update) if update else notification


if TYPE_CHECKING:
    # mypy proves here that Notifier satisfies the protocol producers depend on.
    def _is_a_publisher(notifier: Notifier) -> Publisher:
        return notifier
