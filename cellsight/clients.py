"""Every client of an outside system, built from the settings in one place.

Producers and consumers take their bus entities from here so that both declare them
with the same names and arguments (see ``cellsight.notifications.queues``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from kombu import Connection, Exchange, Queue
from kombu.exceptions import OperationalError
from kombu.transport import resolve_transport

from cellsight.notifications import queues
from cellsight.notifications.bus import REDIS_SCHEMES, Bus, BusError, open_bus, refused
from cellsight.notifications.notifier import Notifier
from cellsight.settings import ConfigError, Settings
from cellsight.urls import redact_url, split_url

if TYPE_CHECKING:
    from cellsight.indexer.consumer import ConsumerConfig
    from cellsight.indexer.engines.base import SearchEngine
    from cellsight.indexer.writer import CellLookup


# The transports Cellsight is built and tested on: RabbitMQ's AMQP, and Redis (the
# embedded bus's; redis:// through Cellsight's own transport, see notifications.bus).
BUS_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", *REDIS_SCHEMES})


class BadBusURL(BusError):
    """``bus_url`` cannot be used: a transport kombu does not have, or a part of it that
    does not parse."""


class BusUnavailable(BusError):
    """The broker cannot be reached; the URL is shown masked."""

    STATE = "is unavailable"

    def __init__(self, shown_url: str, why: str) -> None:
        super().__init__(f"message bus {shown_url} {self.STATE}: {why}")
        self.url = shown_url
        self.why = why


class BusRefused(BusUnavailable):
    """The broker turned the client away (``bus.refused``): its credentials or its
    virtual host; waiting does not help."""

    STATE = "refused the connection"


def _check_scheme(url: str) -> None:
    scheme = url.partition("://")[0]
    base = scheme.partition("+")[0].lower()
    if base not in BUS_SCHEMES:
        try:
            resolve_transport(base or "?")
        except KeyError:  # kombu's signal for an unknown transport name
            raise BadBusURL(
                f"bus URL scheme {scheme!r} is not a kombu transport (amqp://, redis://…)"
            ) from None
        except ImportError:  # one kombu has, without its client library installed
            pass
        # kombu has it, Cellsight does not: memory:// took the outbox relay's notifications
        # into the relaying process, which then deleted them from the outbox.
        memory = " (in-process: what is published there is gone with the process)"
        raise BadBusURL(
            f"bus URL scheme {scheme!r} is a kombu transport Cellsight does not use"
            f"{memory if base == 'memory' else ''}; use amqp:// or amqps:// (RabbitMQ), "
            "or redis://, rediss://, redis+socket://, sentinel://"
        )


def check_bus_url(url: str) -> None:
    """``BadBusURL`` naming what kombu would fail on later, deep inside, as a ValueError:
    a transport kombu or Cellsight does not have, a host or port that does not parse, a
    heartbeat that is not a number of seconds. A ``;``-separated failover list is checked
    URL by URL."""
    for one in url.split(";"):
        _check_scheme(one)
        shown = redact_url(one)
        try:
            parts = split_url(one)
        except ValueError as exc:
            raise BadBusURL(f"bus URL {shown}: {exc}") from None
        if parts.port == 0:  # kombu reads it as "the default port"
            raise BadBusURL(f"bus URL {shown}: port 0 is no port")
        for value in parse_qs(parts.query).get("heartbeat", []):
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and seconds >= 0):
                raise BadBusURL(f"bus URL {shown}: heartbeat {value!r} is not a number of seconds")


def check_urls(settings: Settings) -> None:
    """``ConfigError`` naming the first URL setting its client would refuse, by the same
    check that client runs when it is built (messages mask the password): the bus URL's
    transport, host, port and heartbeat, the search URL's scheme, host and port, the API
    database URL. Run where the settings are read, so that every command refuses a bad
    URL as a bad setting, whether it uses that client or not."""
    from cellsight.cells.database import missing_directory, parse_url
    from cellsight.cells.errors import BadDatabaseURL
    from cellsight.indexer.engines import UnsupportedEngineURL, check_url

    checks: list[tuple[str, str | None, Callable[[str], object]]] = [
        ("bus_url", settings.bus_url, check_bus_url),
        ("search_url", settings.search_url, check_url),
        ("api_db_url", settings.api_db_url, parse_url),
    ]
    for name, url, check in checks:
        if url is None:
            continue
        setting = f"invalid setting {name} (CELLSIGHT_{name.upper()})"
        try:
            url.encode("utf-8")
        except UnicodeEncodeError as exc:
            # Bytes that were not UTF-8 in the environment: the drivers' host encoding
            # failed on them as "internal error: UnicodeError".
            raise ConfigError(f"{setting}: is not valid UTF-8 (at character {exc.start})") from None
        try:
            check(url)
        except (BadBusURL, UnsupportedEngineURL, BadDatabaseURL) as exc:
            raise ConfigError(f"{setting}: {exc}") from None
    # The API database is created on first use, its directory not: a typo there would be
    # a new, empty registry ("no cells registered") rather than an error.
    if settings.api_db_url is not None and (parent := missing_directory(settings.api_db_url)):
        raise ConfigError(
            f"invalid setting api_db_url (CELLSIGHT_API_DB_URL): directory {parent} does not "
            "exist (make it, or unset the setting for the default in the data directory)"
        )


def build_bus(settings: Settings) -> Bus:
    """The configured bus; the embedded one is started or attached to. Close it when done."""
    if settings.bus_url is not None:
        check_bus_url(settings.bus_url)
    return open_bus(
        settings.bus_url,
        settings.bus_dir,
        timeout=settings.publish_timeout,
        visibility_timeout=settings.bus_visibility_timeout,
    )


@contextmanager
def bus_connection(settings: Settings) -> Iterator[Connection]:
    """A connected kombu connection to the configured bus, closed with the bus afterwards;
    a broker that is down or refuses the login raises ``BusUnavailable``."""
    with build_bus(settings) as bus, bus.connection() as connection:
        try:
            connection.connect()
        except (
            OperationalError,
            *connection.connection_errors,
            # a refused login (AMQP 403) is one of the transport's channel errors
            *connection.channel_errors,
        ) as exc:
            why = f"{type(exc).__name__}: {exc}"
            if refused(exc, consumed=False):
                raise BusRefused(bus.display_url, why) from exc
            raise BusUnavailable(bus.display_url, why) from exc
        yield connection


def notifications_exchange(settings: Settings) -> Exchange:
    return queues.notifications_exchange(settings.exchange)


def indexer_queue(settings: Settings) -> Queue:
    return queues.indexer_queue(settings.indexer_queue, settings.exchange)


def dead_letter_exchange(settings: Settings) -> Exchange:
    return queues.dead_letter_exchange(settings.dead_letter_exchange)


def dead_letter_queue(settings: Settings) -> Queue:
    return queues.dead_letter_queue(settings.dead_letter_queue, settings.dead_letter_exchange)


def build_notifier(
    settings: Settings, *, bus: Bus | None = None, declare_indexer_queue: bool = True
) -> Notifier:
    """The notifier producers use.

    Without ``bus`` it opens the configured one and closes it with the notifier. With
    ``declare_indexer_queue`` (the default) the notifier declares the indexer queue and
    the dead-letter queue its messages may move to, so notifications published before
    the indexer first starts wait for it instead of being unroutable.
    """
    owned = bus is None
    bus = build_bus(settings) if bus is None else bus
    declare = [dead_letter_queue(settings), indexer_queue(settings)]
    if not declare_indexer_queue:
        declare = []
    try:
        return Notifier.on_bus(
            bus,
            close_bus=owned,
            exchange=settings.exchange,
            timeout=settings.publish_timeout,
            declare_queues=declare,
        )
    except BaseException:
        if owned:
            bus.close()
        raise


def build_engine(settings: Settings, *, patient: bool = False) -> SearchEngine:
    """The configured search engine: embedded in the data directory unless
    ``search_url`` names an Elasticsearch/OpenSearch cluster. ``patient``: asking the
    cluster what it is, when it does not answer in ``search_timeout`` (too busy, or
    frozen a moment), is tried again as a maintenance run's steps are (``retrying``), for
    the commands that run long anyway; a refused connection still fails at once."""
    from functools import partial

    from cellsight.indexer.engines import build_engine as build
    from cellsight.indexer.engines.base import EngineTimeout
    from cellsight.indexer.retries import retrying

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    made = partial(
        build,
        settings.search_url,
        embedded_path=settings.index_path,
        prefix=settings.index_prefix,
        timeout=settings.search_timeout,
    )
    if not patient or not settings.search_url:
        return made()
    return retrying(made, "asking the search engine what it is", transient=EngineTimeout)


def build_cell_resolver(settings: Settings) -> CellLookup:
    """What the writer asks of the cells: the cell of Nova's own payloads (Cellsight's
    producer puts it in the payload), and whether an instance was purged."""
    from cellsight.cells.mappings import CellRegistry

    return CellRegistry.from_settings(settings)


def build_write_side(settings: Settings) -> tuple[SearchEngine, CellLookup]:
    """The engine and cell resolver of an indexer's writer process, built in that process
    (``functools.partial(build_write_side, settings)`` is what it is handed)."""
    return build_engine(settings), build_cell_resolver(settings)


def build_consumer_config(settings: Settings, **overrides: Any) -> ConsumerConfig:
    """The indexer consumer's names and batching from the settings; ``overrides`` (e.g. a
    shorter ``batch_age`` for the demo) replace single fields."""
    from cellsight.indexer.consumer import ConsumerConfig

    config = ConsumerConfig(
        exchange=settings.exchange,
        queue=settings.indexer_queue,
        dead_letter_exchange=settings.dead_letter_exchange,
        dead_letter_queue=settings.dead_letter_queue,
        batch_count=settings.batch_count,
        batch_bytes=settings.batch_bytes,
        batch_age=settings.batch_age_ms / 1000,
        prefetch=settings.prefetch,
        held_bytes=settings.held_bytes,
        max_in_flight=settings.max_in_flight,
    )
    return dataclasses.replace(config, **overrides)
