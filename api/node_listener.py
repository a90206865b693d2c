"""The API's ear on the bus: notifications drop the node cache entries they change.

Operations run in other processes (the CLI, other API workers, Nova itself), so the
API binds its own queue to the notifications exchange (exclusive, auto-deleted: it
exists while this process listens and never holds a backlog for a dead one) and hands
each notification's event type and payload to ``NodeCache.observe``. A notification
that does not decode is skipped: the indexer, not this listener, dead-letters it.

A lost connection, or a queue the broker will not bind (a refused login, a name still
held by the connection the broker has not yet noticed is gone), is tried again with a
backoff (``RECONNECT_FIRST`` doubling to ``RECONNECT_MAX``; kombu's own for the connect
itself), each bind under a new queue name. What was published meanwhile went to no
queue of this listener's, so the whole cache is dropped when the bus is lost and again
when the queue is bound anew: entries read in the gap are as stale as with the listener
off, never older. Enabled by ``node_cache_listen``; stopped with the returned event.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kombu import Connection, Consumer, Exchange, Message, Queue
from kombu.mixins import ConsumerMixin

from cellsight.api.query2.node_cache import NodeCache
from cellsight.notifications.envelope import decode
from cellsight.notifications.errors import NotificationError
from cellsight.settings import Settings

log = logging.getLogger(__name__)
DRAIN_WAIT = 0.5  # seconds a drain waits for a message: how late a stop is seen
RECONNECT_FIRST = 1.0  # seconds after a lost bind, doubling
RECONNECT_MAX = 30.0


class _Stopped(Exception):
    """Raised from kombu's connect retries once the listener is stopped."""


class NodeListener(ConsumerMixin):
    def __init__(
        self,
        connection: Connection,
        exchange: Exchange,
        cache: NodeCache,
        ready: threading.Event,
        stop: threading.Event,
    ) -> None:
        self.connection = connection
        self.exchange = exchange
        self.cache = cache
        self.ready = ready
        self.stop = stop
        self._bound_before = False
        self._deaf = False  # the bus is lost and the cache dropped for it
        self._backoff = RECONNECT_FIRST

    @property
    def should_stop(self) -> bool:  # type: ignore[override]  # kombu's loop only reads it
        return self.stop.is_set()

    def listen(self) -> None:
        """Until stopped: consume, and after each failure drop the cache and wait."""
        errors = (*self.connection.connection_errors, *self.connection.channel_errors)
        while not self.should_stop:
            try:
                for _ in self.consume(safety_interval=DRAIN_WAIT):
                    pass
            except _Stopped:
                return
            except errors as exc:
                self._lost(exc, self._backoff)
                self.stop.wait(self._backoff)
                self._backoff = min(self._backoff * 2, RECONNECT_MAX)

    @contextmanager
    def establish_connection(self) -> Iterator[Connection]:
        # kombu's, with its sleeps between connects cut short by a stop (checked each second).
        with self.create_connection() as conn:
            conn.ensure_connection(
                self.on_connection_error, self.connect_max_retries, callback=self._stopping
            )
            yield conn

    def _stopping(self) -> None:
        if self.should_stop:
            raise _Stopped

    def get_consumers(self, consumer: Callable[..., Consumer], channel: Any) -> Sequence[Consumer]:
        # py-amqp decodes a body with whatever encoding it names, some in Python in
        # quadratic time (punycode): the bytes go to kombu's JSON reader as they came.
        if hasattr(channel, "auto_decode"):
            channel.auto_decode = False
        queue = Queue(
            # A new name each bind: the broker may still hold the last one for a
            # connection it has not yet seen die (an exclusive queue: RESOURCE_LOCKED).
            f"cellsight-api-nodes-{uuid.uuid4().hex[:12]}",
            self.exchange,
            routing_key="versioned_notifications.*",
            durable=False,
            exclusive=True,
            auto_delete=True,
        )
        return [consumer([queue], callbacks=[self.on_message], accept=["json"])]

    def on_message(self, body: Any, message: Message) -> None:
        try:
            notification = decode(body)
        except NotificationError as exc:
            log.debug("node cache listener skipped a notification: %s", exc)
        else:
            self.cache.observe(notification.event_type, notification.payload)
        message.ack()

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        # A body kombu will not decode (a content type other than JSON, or what the bus
        # could not read): skipped like one that does not decode, never the listener's end.
        log.debug("node cache listener skipped a message: %s: %s", type(exc).__name__, exc)
        message.ack()

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        self._stopping()
        self._lost(exc, interval)

    def _lost(self, exc: BaseException, interval: float) -> None:
        if not self._deaf:
            self._deaf = True
            self.cache.invalidate()
        log.warning(
            "node cache listener is off the bus (%s: %s); trying again in %.0fs",
            type(exc).__name__,
            exc,
            interval,
        )

    def on_consume_ready(
        self, connection: Connection, channel: Any, consumers: Any, **kwargs: Any
    ) -> None:
        if self._bound_before:
            # Whatever was published while no queue of ours was bound was not heard.
            self.cache.invalidate()
            log.warning("node cache listener is back on the bus; the node cache was dropped")
        self._bound_before, self._deaf = True, False
        self._backoff = RECONNECT_FIRST
        self.ready.set()


def start_listener(settings: Settings, cache: NodeCache) -> tuple[threading.Event, threading.Event]:
    """Listen on a thread; returns (ready, stop): ``ready`` is set once the queue is bound."""
    from cellsight.clients import build_bus, notifications_exchange

    ready, stop = threading.Event(), threading.Event()

    def run() -> None:
        try:
            # On this thread, not the request's: starting the embedded bus may fail.
            with build_bus(settings) as bus:
                exchange = notifications_exchange(settings)
                NodeListener(bus.connection(), exchange, cache, ready, stop).listen()
        except Exception:
            log.exception("node cache listener stopped; entries now expire by TTL only")

    threading.Thread(target=run, name="node-cache-listener", daemon=True).start()
    return ready, stop
