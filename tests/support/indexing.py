"""Helpers for indexer tests: a consumer on a thread (index-vs-cells comparison:
``tests.support.drift``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from kombu import Producer

from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.clients import build_bus, build_consumer_config
from cellsight.indexer.consumer import IndexerConsumer
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.write_process import reopened
from cellsight.notifications import queues
from cellsight.settings import Settings, load_settings
from tests.support.services import RABBITMQ_URL, rabbitmq_names
from tests.support.waiting import wait_for  # noqa: F401  (re-exported)


@contextmanager
def embedded_redis(settings: Settings) -> Iterator[redis.Redis]:
    """A plain Redis client on the embedded bus (what anything with its socket could
    write), kept open, with the server, until exit."""
    with build_bus(settings) as bus:
        assert bus.server is not None
        client = redis.Redis(unix_socket_path=str(bus.server.socket))
        try:
            yield client
        finally:
            client.close()


def publish_bodies(settings: Settings, bodies: Iterable[bytes], **options: Any) -> None:
    """``bodies`` as they are, to the indexer's queue (declared, with its exchange) on
    ``settings``' bus: persistent JSON unless ``options`` say otherwise."""
    with build_bus(settings) as bus, bus.connection() as conn:
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        producer = Producer(conn.channel())
        for body in bodies:
            producer.publish(
                body,
                exchange=exchange,
                routing_key="versioned_notifications.info",
                **({"content_type": "application/json", "content_encoding": "binary",
                    "delivery_mode": 2} | options),
            )  # fmt: skip


def bus_settings(data_dir: Path, bus: str, **extra: Any) -> Settings:
    """Settings on RabbitMQ (unique exchange and queues, so tests never share a stream;
    deleted when the session ends, ``services.remove_rabbitmq_names``) or on the embedded
    Redis bus in ``data_dir``."""
    if bus == "embedded":
        return load_settings(data_dir=data_dir, **extra)
    tag = uuid.uuid4().hex[:10]
    rabbitmq_names(
        queues=(f"t-idx-{tag}", f"t-dlq-{tag}"), exchanges=(f"t-nova-{tag}", f"t-dlx-{tag}")
    )
    return load_settings(
        data_dir=data_dir,
        bus_url=RABBITMQ_URL,
        exchange=f"t-nova-{tag}",
        indexer_queue=f"t-idx-{tag}",
        dead_letter_exchange=f"t-dlx-{tag}",
        dead_letter_queue=f"t-dlq-{tag}",
        **extra,
    )


PIPELINES = ["threads", "process"]
"""How the indexer writes: writer threads in its process, or a writer process (the CLI's
default). Contract tests of the consumer run on both, with the cycle collector run
between batches as the CLI runs it."""


@contextmanager
def running_indexer(
    settings: Settings, engine: SearchEngine, pipeline: str = "threads", **overrides: Any
) -> Iterator[IndexerConsumer]:
    """An indexer consuming on a thread, writing through ``pipeline``; stopped (flush,
    ack, close) on exit."""
    with build_bus(settings) as bus, bus.connection() as connection:
        consumer = IndexerConsumer(
            connection,
            engine,
            build_consumer_config(settings, **({"batch_age": 0.05} | overrides)),
            write_process=reopened(engine) if pipeline == "process" else None,
            collect_between_batches=True,
        )
        with consuming(consumer):
            yield consumer


def started(consumer: IndexerConsumer) -> tuple[threading.Thread, list[BaseException]]:
    """``consumer.run`` on a thread, started; what it raised, if it did, lands in the list."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as exc:  # surfaced by the test
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failure


@contextmanager
def consuming(consumer: IndexerConsumer) -> Iterator[IndexerConsumer]:
    """``consumer`` running on a thread; stopped (flush, ack, close) on exit."""
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        yield consumer
    finally:
        consumer.stop.set()
        thread.join(30)
        assert not thread.is_alive(), "indexer did not stop"


def sqlite_cluster(settings: Settings, hosts: int = 2) -> CellRegistry:
    """Two SQLite cells in the data directory, each with ``hosts`` compute nodes in az1:
    the cluster of the indexer's process-level tests."""
    registry = CellRegistry.from_settings(settings)
    for name in ("cell1", "cell2"):
        cell = registry.add_cell(name, f"sqlite:///{settings.data_dir.resolve() / (name + '.db')}")
        for n in range(1, hosts + 1):
            add_compute_node(registry.cell_engine(cell), f"host{n}", availability_zone="az1")
    return registry


def frames_received(consumer: IndexerConsumer) -> int:
    """The frames py-amqp has read on the consumer's connection (not kombu's property,
    which would connect again from this thread were the connection down)."""
    amqp = consumer.connection._connection
    assert amqp is not None, "not connected"
    return int(amqp.bytes_recv)
