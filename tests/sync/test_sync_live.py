"""A full sync while a producer keeps creating, updating and deleting instances through
the real write path ends with an index equal to the cells, row by row."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

from cellsight.cells.errors import CellsError
from cellsight.cells.instances import BootRequest
from cellsight.indexer.index_roles import is_synced, layout
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.support.sync_world import IndexingPublisher, World


class Producer(threading.Thread):
    """Cluster operations in a loop, each one's notifications written to the index by
    ``BatchWriter`` (racing the sync). ``step()`` lets the sync wait for an operation."""

    def __init__(self, world: World, seed: int) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.ops = world.ops(IndexingPublisher(world.engine))
        self.rng = random.Random(seed)
        self.live = sorted(u for u, d in world.rows().items() if not d["deleted"])
        self.stop = threading.Event()
        self.done = threading.Semaphore(0)
        self.counts = {"create": 0, "update": 0, "delete": 0}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self._one():
                    self.done.release()
        except BaseException as exc:
            self.error = exc
            self.done.release()

    def step(self, timeout: float = 10.0) -> None:
        """Block until the producer has finished one more operation."""
        assert self.done.acquire(timeout=timeout), "the producer is stuck"

    def _one(self) -> bool:
        choice = self.rng.random()
        try:
            if choice < 0.3 or not self.live:
                cell = self.rng.choice(self.world.cells).name
                request = BootRequest(
                    display_name=f"live-{self.rng.random():.6f}",
                    flavor="m1.tiny",
                    project_id="p",
                    user_id="u",
                    cell=cell,
                )
                self.live.append(self.ops.boot(request).instances[0].uuid)
                self.counts["create"] += 1
            elif choice < 0.85:
                uuid = self.rng.choice(self.live)
                action = self.rng.choice(["rename", "meta", "tags", "stop", "start"])
                if action == "rename":
                    self.ops.rename(uuid, f"renamed-{self.rng.random():.6f}")
                elif action == "meta":
                    self.ops.update_metadata(uuid, {"k": str(self.rng.random())})
                elif action == "tags":
                    self.ops.set_tags(uuid, [f"t{self.rng.randrange(5)}"])
                elif action == "stop":
                    self.ops.power_off(uuid)
                else:
                    self.ops.power_on(uuid)
                self.counts["update"] += 1
            else:
                uuid = self.live.pop(self.rng.randrange(len(self.live)))
                self.ops.delete(uuid)
                self.counts["delete"] += 1
        except CellsError:
            return False  # wrong state, no room: the cluster said no
        return True


class Lockstep:
    """Sync progress that waits for a live operation after every batch it wrote."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def phase(self, text: str) -> None:
        self.producer.step()

    def start_cells(self, cells: Sequence[tuple[str, str, int]]) -> None:
        pass

    def advance(self, cell_uuid: str, n: int) -> None:
        self.producer.step()
        self.producer.step()


def _sync_racing_producer(world: World, **options: Any) -> Producer:
    world.engine.ensure_ready("instance")
    producer = Producer(world, seed=len(world.cells))
    producer.start()
    try:
        report = run_sync(
            world.engine, world.registry, SyncOptions(**options), progress=Lockstep(producer)
        )
    finally:
        producer.stop.set()
        producer.join(30)
    assert producer.error is None, producer.error
    assert report.rows > 0 and all(c["rejected"] == 0 for c in report.cells)
    return producer


def test_sync_while_the_cluster_changes_ends_equal_to_the_cells(world: World) -> None:
    producer = _sync_racing_producer(world, batch_size=3)
    assert min(producer.counts.values()) > 0, producer.counts
    world.assert_index_equals_cells()
    assert is_synced(world.engine, "instance")
    current = layout(world.engine, "instance")
    assert current.serving is not None and current.writers == [current.serving.name]
    assert current.stray == []


def test_rebuild_with_reader_processes_while_the_cluster_changes(make_world: Any) -> None:
    world: World = make_world("sqlite", "embedded", cells=3, instances=200)
    run_sync(world.engine, world.registry, SyncOptions())  # the index being rebuilt
    producer = _sync_racing_producer(world, batch_size=50, processes=True, workers=2)
    assert producer.counts["create"] > 0
    world.assert_index_equals_cells()
    retired = layout(world.engine, "instance").retired
    assert len(retired) == 1  # --keep-old 1: the previous index, nothing older
