"""The broker closing the indexer's channel mid-stream (RabbitMQ does when a delivery
stays unacknowledged past its ``consumer_timeout``, as a batch does through a long
engine outage) is a lost channel, not the end of the indexer: it consumes again on a new
channel and every message is indexed and acked. A declaration the broker refuses is
still raised: that is a setting to fix."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Connection

from cellsight.clients import build_bus, build_consumer_config
from cellsight.indexer.consumer import IndexerConsumer
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.indexer.test_poison_bus import publish
from tests.support import novagen
from tests.support.indexing import (
    PIPELINES,
    bus_settings,
    running_indexer,
    started,
    wait_for,
)

pytestmark = pytest.mark.services


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_channel_the_broker_closes_is_reopened_and_nothing_is_lost(
    pipeline: str, tmp_path: Path, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    kinds = list(novagen.EVENT_CLASSES)
    uuids = [str(uuid.uuid4()) for _ in range(40)]
    goods = [
        novagen.notification(kinds[i % len(kinds)], seed=900 + i, uuid_=u)
        for i, u in enumerate(uuids)
    ]
    ack = IndexerConsumer._ack
    closed: list[int] = []

    def ack_or_provoke(self: IndexerConsumer, batch: list[Any]) -> None:
        if not closed:
            # The first batch's ack names a tag the channel never delivered: the real
            # broker closes the channel (406), and that batch stays unacked.
            last = max(batch, key=lambda m: m.delivery_tag)
            closed.append(len(batch))
            last.channel.basic_ack(last.delivery_tag + 100_000, multiple=False)
            return
        ack(self, batch)

    monkeypatch.setattr(IndexerConsumer, "_ack", ack_or_provoke)
    publish(settings, [novagen.body(g) for g in goods])
    with running_indexer(settings, engine, pipeline, batch_count=10) as consumer:
        # Redelivered on the new channel: every message acked there.
        def all_acked_again() -> bool:
            return bool(closed) and consumer.acked - closed[0] >= len(goods)

        wait_for(all_acked_again, 60, "all acked again")
    assert closed and consumer.totals["dead"] == 0
    assert all(engine.get("instance", u) is not None for u in uuids)
    with build_bus(settings) as bus, bus.connection() as conn, conn.channel() as channel:
        depth = channel.queue_declare(settings.indexer_queue, passive=True).message_count
    assert depth == 0  # nothing left unacked behind the closed channel
    engine.close()


def test_a_declaration_the_broker_refuses_is_raised(tmp_path: Path, rabbitmq_url: str) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    # The queue exists with other arguments than the indexer's: a setting to fix.
    with Connection(rabbitmq_url) as conn, conn.channel() as channel:
        channel.queue_declare(settings.indexer_queue, durable=False, auto_delete=True)
    engine = EmbeddedEngine(tmp_path / "index.db")
    with build_bus(settings) as bus, bus.connection() as connection:
        consumer = IndexerConsumer(connection, engine, build_consumer_config(settings))
        thread, failure = started(consumer)
        thread.join(30)
        stuck = thread.is_alive()
        consumer.stop.set()
        thread.join(10)
    assert not stuck, "a refused declaration was retried"
    assert failure and isinstance(failure[0], PreconditionFailed), failure
    engine.close()


def test_an_idle_indexer_keeps_a_connection_with_heartbeats(
    tmp_path: Path, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With heartbeats asked for in the bus URL, the indexer sends them: the broker closed
    an idle indexer's connection after two silent intervals (an adversarial probe, at
    ``?heartbeat=5``: twice in 45 s). Idle for three and a half intervals, it keeps its
    connection, then indexes what comes."""
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    settings = settings.model_copy(update={"bus_url": f"{rabbitmq_url}?heartbeat=2"})
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    good = novagen.notification(next(iter(novagen.EVENT_CLASSES)), seed=77)
    with running_indexer(settings, engine, "process") as consumer:
        first = consumer.connection
        assert first.heartbeat == 2
        # The broker's own timer: it closes a connection silent for two intervals.
        quiet = threading.Event()
        quiet.wait(7.0)
        assert consumer.connection is first  # not lost, not replaced
        publish(settings, [novagen.body(good)])
        wait_for(lambda: consumer.acked >= 1, 30, "the notification acked")
    assert "bus connection lost" not in caplog.text
    assert consumer.totals["indexed"] == 1
    engine.close()
