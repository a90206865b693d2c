"""The consumer's write pipeline: batches written while later ones are received and
decoded, several in flight, settled and acked strictly in order; on shutdown a write
that cannot finish stays unacked and the next consumer gets its messages."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kombu import Producer

from cellsight.clients import build_bus
from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteResult
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from cellsight.settings import Settings
from tests.support import novagen
from tests.support.indexing import publish_bodies, running_indexer, wait_for

FIRST_ID = "00000000-0000-4000-8000-000000000000"  # of the first notification published


class GatedEngine:
    """A real engine whose ``bulk`` of the first published document waits for
    ``release``: a slow write at the head of the pipeline (writer threads may start in
    any order). Counts the writes that finished."""

    def __init__(self, engine: SearchEngine, held_id: str = FIRST_ID) -> None:
        self.engine = engine
        self.release = threading.Event()
        self.first_started = threading.Event()
        self.finished = 0
        self._lock = threading.Lock()
        self.held_id = held_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        first = any(op.id == self.held_id for op in ops)
        try:
            if first:
                self.first_started.set()
                self.release.wait(60)
            return self.engine.bulk(ops)
        finally:
            with self._lock:
                self.finished += 1


def _publish(settings: Settings, samples_dir: Path, count: int) -> list[str]:
    """``count`` instance.update notifications, each about its own instance."""
    sample = json.loads((samples_dir / "instance-update.json").read_text())
    uuids = []
    with build_bus(settings) as bus, bus.connection() as conn:
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        producer = Producer(conn.channel())
        for i in range(count):
            uuid = f"00000000-0000-4000-8000-{i:012d}"
            sample["payload"]["nova_object.data"]["uuid"] = uuid
            uuids.append(uuid)
            producer.publish(
                json.dumps(sample).encode(),
                exchange=exchange,
                routing_key=queues.routing_key("INFO"),
                content_type="application/json",
                content_encoding="binary",
                delivery_mode=2,
            )
    return uuids


@pytest.fixture
def settings(each_bus: Settings) -> Settings:
    return each_bus


def test_later_batches_are_written_but_acked_only_after_the_first(
    settings: Settings, samples_dir: Path, tmp_path: Path
) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    gated = GatedEngine(engine)
    uuids = _publish(settings, samples_dir, 40)
    with running_indexer(
        settings,
        gated,  # type: ignore[arg-type]
        batch_count=5,
        batch_age=0.02,
        max_in_flight=3,
    ) as consumer:
        assert consumer.in_flight == 3
        wait_for(gated.first_started.is_set, what="first write")
        wait_for(lambda: gated.finished >= 2, what="later writes while the first is held")
        assert consumer.acked == 0  # written, but the first batch's verdict is not known
        # Not asserted: that the held write overlapped the others. Writer threads start
        # in any order, and later batches may finish before it starts.
        gated.release.set()
        wait_for(lambda: consumer.acked >= len(uuids), what="all acked")
    assert consumer.totals == {"indexed": 40, "stale": 0, "ignored": 0, "dead": 0}
    assert all(engine.get("instance", u) is not None for u in uuids)
    engine.close()


def test_a_write_unfinished_at_shutdown_stays_unacked_for_the_next_consumer(
    settings: Settings, samples_dir: Path, tmp_path: Path
) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    gated = GatedEngine(engine)
    uuids = _publish(settings, samples_dir, 12)
    with running_indexer(settings, gated, batch_count=100, batch_age=0.02) as consumer:  # type: ignore[arg-type]
        wait_for(gated.first_started.is_set, what="first write")
        # leaving the block sets stop; the held write outlives the grace period
    assert consumer.acked == 0
    gated.release.set()
    with running_indexer(settings, engine) as second:
        wait_for(lambda: second.acked >= len(uuids), what="redelivered and written")
    assert second.totals["indexed"] + second.totals["stale"] == len(uuids)
    assert all(engine.get("instance", u) is not None for u in uuids)
    engine.close()


def test_a_batch_count_past_amqps_prefetch_field_still_indexes(
    settings: Settings, tmp_path: Path
) -> None:
    """``batch_count`` times the batches in flight is the prefetch the consumer asks
    for; past 65,535 (AMQP's 16-bit ``prefetch_count``) it asks for the most the field
    holds, and the batches end by age."""
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    notifications = [novagen.notification("instance.update", seed=i) for i in range(3)]
    uuids = [n["payload"]["nova_object.data"]["uuid"] for n in notifications]
    publish_bodies(settings, [novagen.body(n) for n in notifications])
    with running_indexer(settings, engine, batch_count=50_000, max_in_flight=5) as consumer:
        assert consumer.prefetch == 65_535
        wait_for(lambda: consumer.acked >= len(uuids), what="all acked")
    assert all(engine.get("instance", u) is not None for u in uuids)
    engine.close()
