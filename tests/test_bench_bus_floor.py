"""The ratio target's limit (``bench/bus_floor.py``): the indexer's own consumer drains a
real RabbitMQ queue, a child process writes one prepared row a notification through
the floor's SQL, and every message is acked, none dead-lettered, with its row written."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support import novagen
from tests.support.services import rabbitmq_names

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the benchmarks import ``bench.*``
    # The child is spawned: it finds ``bench.*`` through the parent's sys.path.
    return argparse.Namespace(
        bus=importlib.import_module("bench.bus"),
        bus_floor=importlib.import_module("bench.bus_floor"),
        measure=importlib.import_module("bench.measure"),
    )


@pytest.fixture
def topo(bench: Any, rabbitmq_url: str) -> Iterator[Any]:
    topo = bench.bus.Topology.fresh("bus-floor-test")
    rabbitmq_names(queues=[topo.queue, topo.dlq], exchanges=[topo.exchange, topo.dlx])
    yield topo
    topo.delete(rabbitmq_url)


def test_the_bus_floor_consumer_acks_every_notification_once_its_rows_are_written(
    bench: Any, topo: Any, rabbitmq_url: str, tmp_path: Path
) -> None:
    bodies = [novagen.body(novagen.notification(seed=seed)) for seed in range(2_500)]
    pipeline = bench.bus_floor.FloorPipeline(tmp_path / "bus_floor.db")
    engine = EmbeddedEngine(tmp_path / "distribution.db")
    tally = bench.measure.Tally()
    config = ConsumerConfig(batch_count=1_000, batch_age=0.2)
    args = argparse.Namespace(amqp=rabbitmq_url)
    try:
        for chunk in (bodies[:1_200], bodies[1_200:]):  # rows continue from drain to drain
            bench.bus_floor.bus_floor_chunk(args, pipeline, engine, topo, config, chunk, tally)
        assert pipeline.documents() == len(bodies)
    finally:
        pipeline.shutdown()
        engine.close()
    summary = tally.summary("notifications")
    assert summary["notifications"] == len(bodies)
    assert summary["cpu_us_per_notification_writer_process"] > 0  # the child's CPU counted
    with Connection(rabbitmq_url) as conn:
        assert topo.depth(conn) == 0  # every message acked
        assert topo.dead_letters(conn) == 0
    assert not list(tmp_path.glob("bus_floor.db*"))  # its files removed at shutdown


def test_the_bus_floor_refuses_bodies_that_are_not_one_write_each(
    bench: Any, tmp_path: Path
) -> None:
    pipeline = bench.bus_floor.FloorPipeline(tmp_path / "bus_floor.db")
    try:
        planned = "failed: RuntimeError: 1 writes planned for 2 bodies"
        with pytest.raises(RuntimeError, match=planned):
            pipeline.load([novagen.body(novagen.notification(seed=1)), b"not json"])
    finally:
        pipeline.shutdown()
