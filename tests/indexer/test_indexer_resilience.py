"""The indexer loses nothing: killed mid-batch (SIGKILL) while a producer runs, and with
the engine unreachable mid-stream for as long as the writer keeps retrying."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.errors import CellsError
from cellsight.cells.instances import BootRequest
from cellsight.cells.operations import Operations
from cellsight.clients import build_bus, build_notifier
from cellsight.indexer.dlq import peek
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from cellsight.indexer.metrics import REGISTRY
from cellsight.settings import Settings
from tests.support.drift import index_differences, index_matches
from tests.support.indexing import (
    PIPELINES,
    bus_settings,
    running_indexer,
    sqlite_cluster,
    wait_for,
)
from tests.support.publishers import CountingPublisher

pytestmark = pytest.mark.services


class Producer(threading.Thread):
    """Random cluster operations until stopped; failures of an operation's own
    preconditions (e.g. powering on a running instance) are expected and skipped."""

    def __init__(self, ops: Operations, seed: int, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.ops = ops
        self.pause = pause
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.uuids: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                with contextlib.suppress(CellsError):  # e.g. NoValidHost once cells are full
                    self.step()
                self.stop.wait(self.pause)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def step(self) -> None:
        ops, rng = self.ops, self.rng
        if len(self.uuids) < 5 or rng.random() < 0.25:
            made = ops.boot(
                BootRequest(
                    display_name=f"vm{rng.randrange(1000)}",
                    flavor="m1.small",
                    project_id=rng.choice(["p1", "p2"]),
                    user_id="u",
                    count=rng.randint(1, 4),
                )
            )
            self.uuids += [p.uuid for p in made.instances]
            return
        vm = rng.choice(self.uuids)
        action: Any = rng.choice(
            [
                lambda: ops.rename(vm, f"n{rng.randrange(1000)}"),
                lambda: ops.power_off(vm),
                lambda: ops.power_on(vm),
                lambda: ops.set_tags(vm, rng.sample(["a", "b", "c", "d"], 2)),
                lambda: ops.resize(vm, rng.choice(["m1.small", "m1.large"])),
                lambda: ops.delete(vm),
            ]
        )
        action()


def _indexer_process(settings: Settings) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "CELLSIGHT_BUS_URL": settings.bus_url or "",
            "CELLSIGHT_EXCHANGE": settings.exchange,
            "CELLSIGHT_INDEXER_QUEUE": settings.indexer_queue,
            "CELLSIGHT_DEAD_LETTER_EXCHANGE": settings.dead_letter_exchange,
            "CELLSIGHT_DEAD_LETTER_QUEUE": settings.dead_letter_queue,
            "CELLSIGHT_BATCH_AGE_MS": "100",
            "CELLSIGHT_BATCH_COUNT": "50",
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellsight", "--data-dir", str(settings.data_dir), "indexer"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # It prints one line once its signal handlers are in place and it is consuming.
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("indexer:"), line + (proc.stderr.read().decode() if proc.stderr else "")
    return proc


def test_sigkill_mid_batch_loses_nothing(rabbitmq_url: str, tmp_path: Path) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    registry = sqlite_cluster(settings, hosts=3)
    notifier = build_notifier(settings)
    publisher = CountingPublisher(notifier)
    producer = Producer(Operations(registry, publisher, publisher_id="test"), seed=7)
    producer.start()
    rng = random.Random(11)
    kills = 0
    try:
        for _ in range(4):
            proc = _indexer_process(settings)
            time.sleep(rng.uniform(0.3, 1.5))
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
    finally:
        producer.stop.set()
        producer.join(30)
    assert producer.error is None, producer.error
    assert kills == 4 and publisher.count > 100
    final = _indexer_process(settings)
    engine = EmbeddedEngine(settings.index_path)
    try:
        wait_for(lambda: index_matches(registry, engine), timeout=90, what="index == cells")
    finally:
        final.send_signal(signal.SIGTERM)
        assert final.wait(30) == 0  # graceful: flush, ack, close
    with build_bus(settings) as bus, bus.connection() as conn:
        assert list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue)) == []
    assert engine.count("instance") == len(set(producer.uuids))
    engine.close()
    notifier.close()
    registry.close()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _retries() -> float:
    return REGISTRY.get_sample_value("cellsight_indexer_retries_total") or 0.0


def _engine_up() -> float | None:
    return REGISTRY.get_sample_value("cellsight_indexer_engine_up")


# Enough failed attempts that the writer's backoff reaches its cap (2 s here) at least once.
OUTAGE_RETRIES = 6


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_engine_outage_acks_nothing_then_drains(
    rabbitmq_url: str, own_osmem: Any, tmp_path: Path, pipeline: str
) -> None:
    server = own_osmem
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    registry = sqlite_cluster(settings, hosts=3)
    engine = OpenSearchEngine(server.url, prefix="outage", timeout=1.0)
    engine.ensure_ready("instance")
    publisher = CountingPublisher(build_notifier(settings))
    producer = Producer(Operations(registry, publisher, publisher_id="test"), seed=3, pause=0.02)
    with running_indexer(settings, engine, pipeline, max_backoff=2.0) as consumer:
        producer.start()
        wait_for(lambda: consumer.acked > 20, what="first acks")
        os.kill(server.pid, signal.SIGSTOP)
        wait_for(lambda: _stopped(server.pid), what="engine stopped")
        # Once a write has been retried, every batch before it is acked (one consumer
        # thread: write, then ack) and the one being retried cannot be.
        first = _retries()
        wait_for(lambda: _retries() > first, what="a write retried on the stopped engine")
        acked_at_outage = consumer.acked
        sent_at_outage = publisher.count
        wait_for(
            lambda: _retries() >= first + OUTAGE_RETRIES and publisher.count > sent_at_outage,
            timeout=90,
            what=f"{OUTAGE_RETRIES} retries during the outage while the stream flows",
        )
        assert consumer.acked == acked_at_outage, "acked while the engine was down"
        assert publisher.count > sent_at_outage  # the stream kept flowing meanwhile
        # A probe: the gauge said 1 through a whole outage (nothing ever set it to 0).
        assert _engine_up() == 0
        os.kill(server.pid, signal.SIGCONT)
        producer.stop.set()
        producer.join(30)
        wait_for(lambda: consumer.acked >= publisher.count, timeout=90, what="backlog drained")
    assert producer.error is None
    assert consumer.totals["dead"] == 0
    assert _engine_up() == 1
    assert index_differences(registry, engine) == {}
    engine.close()
    registry.close()
