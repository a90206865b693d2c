"""The API's ear on the bus: notifications drop the node cache entries they change.

Operations run in other processes (the CLI, other API workers, Nova itself), so the
API binds its own queue to the notifications exchange (exclusive, auto-deleted: it
exists while this process listens and never holds a backlog for a dead one) and hands
each notification's event type and payload to ``NodeCache.observe``. A notification
that does not decode is skipped: the indexer, not this listener, dead-letters it.
Enabled by the ``node_cache_listen`` setting; stopped with the returned event.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any

from kombu import Consumer, Message, Queue

from cellsight.api.query2.node_cache import NodeCache
from cellsight.notifications.envelope import decode
from cellsight.notifications.errors import NotificationError
from cellsight.settings import Settings

log = logging.getLogger(__name__)


def start_listener(settings: Settings, cache: NodeCache) -> tuple[threading.Event, threading.Event]:
    """Listen on a thread; returns (ready, stop): ``ready`` is set once the queue is bound."""
    from cellsight.clients import build_bus, notifications_exchange

    ready, stop = threading.Event(), threading.Event()

    def on_message(body: Any, message: Message) -> None:
        try:
            notification = decode(body)
        except NotificationError as exc:
            log.debug("node cache listener skipped a notification: %s", exc)
        else:
            cache.observe(notification.event_type, notification.payload)
        message.ack()

    def on_undecodable(message: Message, exc: Exception) -> None:
        # A body kombu will not decode (a content type other than JSON, or what the bus
        # could not read): skipped like one that does not decode, never the listener's end.
        log.debug("node cache listener skipped a message: %s: %s", type(exc).__name__, exc)
        message.ack()

    def run() -> None:
        try:
            listen()
        except Exception:
            log.exception("node cache listener stopped; entries now expire by TTL only")

    def listen() -> None:
        queue = Queue(
            f"cellsight-api-nodes-{uuid.uuid4().hex[:12]}",
            notifications_exchange(settings),
            routing_key="versioned_notifications.*",
            durable=False,
            exclusive=True,
            auto_delete=True,
        )
        with (
            build_bus(settings) as bus,
            bus.connection() as connection,
            connection.channel() as channel,
        ):
            # py-amqp decodes a body with whatever encoding it names, some in Python in
            # quadratic time (punycode): the bytes go to kombu's JSON reader as they came.
            if hasattr(channel, "auto_decode"):
                channel.auto_decode = False
            with Consumer(
                channel,
                [queue],
                callbacks=[on_message],
                on_decode_error=on_undecodable,
                accept=["json"],
            ):
                ready.set()
                while not stop.is_set():
                    # socket.timeout too: nothing within 0.5 s
                    with contextlib.suppress(TimeoutError):
                        connection.drain_events(timeout=0.5)
                    # AMQP heartbeats, if the bus URL asks for them: kombu sends them only
                    # when asked (the broker closed a silent listener after two intervals).
                    connection.heartbeat_check()

    threading.Thread(target=run, name="node-cache-listener", daemon=True).start()
    return ready, stop
