"""The API's ear on the bus: notifications drop the node cache entries they change.

Operations run in other processes (the CLI, other API workers, Nova itself), so the
API binds its own queue to the notifications exchange (exclusive, auto-deleted: it
exists while this process listens and never holds a backlog for a dead one) and hands
each notification's event type and payload to ``NodeCache.observe``. A notification
that does not decode is skipped: the indexer, not this listener, dead-letters it.

A lost connection is reconnected by kombu's ``ConsumerMixin`` (with its backoff). What
was published meanwhile went to no queue of this listener's, so the whole cache is
dropped when the bus is found unreachable and again when the queue is bound anew: the
entries read in the gap are as stale as with the listener off, never older.
Enabled by the ``node_cache_listen`` setting; stopped with the returned event.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kombu import Connection, Consumer, Message, Queue
from kombu.mixins import ConsumerMixin

from cellsight.api.query2.node_cache import NodeCache
from cellsight.notifications.envelope import decode
from cellsight.notifications.errors import NotificationError
from cellsight.settings import Settings

log = logging.getLogger(__name__)
DRAIN_WAIT = 0.5  # seconds a drain waits for a message; bounds how late a stop is seen


class _Stopped(Exception):
    """Raised from kombu's connect retries once the listener is stopped."""


class NodeListener(ConsumerMixin):
    def __init__(
        self, connection: Connection, queue: Queue, cache: NodeCache, stop: threading.Event
    ) -> None:
        self.connection = connection
        self.queue = queue
        self.cache = cache
        self.stop = stop
        self.ready = threading.Event()
        self._bound_before = False
        self._deaf = False  # the bus is lost and the cache dropped for it

    @property
    def should_stop(self) -> bool:  # type: ignore[override]  # kombu's loop only reads it
        return self.stop.is_set()

    def get_consumers(self, consumer: Callable[..., Consumer], channel: Any) -> Sequence[Consumer]:
        # py-amqp decodes a body with whatever encoding it names, some in Python in
        # quadratic time (punycode): the bytes go to kombu's JSON reader as they came.
        if hasattr(channel, "auto_decode"):
            channel.auto_decode = False
        return [consumer([self.queue], callbacks=[self.on_message], accept=["json"])]

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
        if self.should_stop:
            raise _Stopped from exc
        if not self._deaf:
            self._deaf = True
            self.cache.invalidate()
        log.warning(
            "node cache listener cannot reach the bus (%s: %s); trying again in %.0fs",
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
        self.ready.set()

    def listen(self) -> None:
        try:
            self.run(safety_interval=DRAIN_WAIT)
        except _Stopped:
            pass
        except Exception:
            log.exception("node cache listener stopped; entries now expire by TTL only")


def start_listener(settings: Settings, cache: NodeCache) -> tuple[threading.Event, threading.Event]:
    """Listen on a thread; returns (ready, stop): ``ready`` is set once the queue is bound."""
    from cellsight.clients import build_bus, notifications_exchange

    stop = threading.Event()
    queue = Queue(
        f"cellsight-api-nodes-{uuid.uuid4().hex[:12]}",
        notifications_exchange(settings),
        routing_key="versioned_notifications.*",
        durable=False,
        exclusive=True,
        auto_delete=True,
    )
    bus = build_bus(settings)
    listener = NodeListener(bus.connection(), queue, cache, stop)

    def run() -> None:
        with bus:
            listener.listen()

    threading.Thread(target=run, name="node-cache-listener", daemon=True).start()
    return listener.ready, stop
