"""The cycle collector between batches (``cellsight.indexer.collector``): its schedule on
an injected clock, that it frees garbage cycles at a batch's end, and that a consumer
that owns its process turns automatic collection off only while it runs."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.indexer import write_child
from cellsight.indexer.collector import MIDDLE_EVERY, BatchCollector
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.write_wire import encode_planned, pack, unpack
from cellsight.indexer.writer import BatchWriter, plan
from cellsight.settings import Settings
from tests.indexer.test_poison_bus import publish
from tests.support import novagen, poison
from tests.support.indexing import running_indexer, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gc_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def _garbage_cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_collection_is_off_inside_and_restored_after(gc_restored: None) -> None:
    gc.enable()
    with BatchCollector():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with BatchCollector():
        assert not gc.isenabled()
    assert not gc.isenabled()  # it was off on entry: the owner turned it off, not us


def test_the_schedule_young_middle_full_and_idle(gc_restored: None) -> None:
    clock = Clock()
    with BatchCollector(full_every=60.0, clock=clock, young_every=1.0) as collector:
        assert collector.batch_done() == 0  # the first batch's end
        generations = []
        for _ in range(MIDDLE_EVERY * 2 * 4):
            clock.now += 0.25  # four batches a second: one young pass a second
            generations.append(collector.batch_done())
        young = [None, None, None, 0]
        middle = [None, None, None, 1]
        assert generations == (young * (MIDDLE_EVERY - 2) + middle + young) * 2
        assert collector.idle() is None
        clock.now += 40.0
        assert collector.batch_done() == 2
        assert collector.batch_done() is None  # every pass restarts the young clock
        clock.now += 1.0
        assert collector.batch_done() == 0
        clock.now += 58.9  # 59.9 s after the full pass: its clock restarted there
        assert collector.idle() is None
        clock.now += 0.1
        assert collector.idle() == 2
        assert collector.idle() is None


def test_a_garbage_cycle_lives_until_a_batch_ends_with_a_pass_due(gc_restored: None) -> None:
    gc.enable()
    clock = Clock()
    with BatchCollector(clock=clock, young_every=1.0) as collector:
        assert collector.batch_done() == 0
        ref = _garbage_cycle()
        # Enough live containers to set off many automatic passes, were they on.
        kept = [[i] for i in range(50 * gc.get_threshold()[0])]
        clock.now += 0.5
        assert collector.batch_done() is None
        assert ref() is not None
        clock.now += 0.5
        assert collector.batch_done() == 0
        assert ref() is None
        del kept


def test_a_process_owning_consumer_collects_only_while_it_runs(
    each_bus: Settings, tmp_path: Path, gc_restored: None
) -> None:
    gc.enable()
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    goods = [poison.good(seed=300 + i) for i in range(30)]
    wire = [novagen.body(g) for g in goods]
    bodies = [*wire[:15], b"\xff{ not json", *wire[15:]]  # one dead letter among them
    passes: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with running_indexer(each_bus, engine, "process") as consumer:
            wait_for(lambda: not gc.isenabled(), timeout=10, what="collection off")
            before = len(passes)
            publish(each_bus, bodies)
            wait_for(lambda: consumer.acked >= len(bodies), timeout=60, what="all acked")
            assert not gc.isenabled()
            assert consumer.totals["dead"] == 1
            # Automatic passes are off, so these are the collector's, one per batch.
            assert len(passes) - before >= 1
    finally:
        gc.callbacks.remove(count)
    assert gc.isenabled()
    engine.refresh("instance")
    assert engine.count("instance") == len(goods)


class Spy(BatchCollector):
    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.idles = 0

    def batch_done(self) -> int | None:
        self.batches += 1
        return super().batch_done()

    def idle(self) -> int | None:
        self.idles += 1
        return super().idle()


def test_the_writer_child_collects_after_each_batch_and_when_idle(
    tmp_path: Path, gc_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's loop, in this process on a real pipe and engine."""
    monkeypatch.setattr(write_child, "IDLE_WAIT", 0.01)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    ours, theirs = multiprocessing.Pipe()
    spy = Spy()
    writer = BatchWriter(engine, record_metrics=False)
    _, planned = plan([novagen.body(poison.good(seed=500 + i)) for i in range(3)])
    loop = threading.Thread(
        target=write_child._commit_loop,
        args=(theirs, writer, 1, lambda m: theirs.send_bytes(pack(m)), spy),
        daemon=True,
    )
    with spy:
        loop.start()
        ours.send_bytes(pack(("batch", 1, 3, [encode_planned(p) for p in planned])))
        assert ours.poll(30)
        kind, seq, verdicts = unpack(ours.recv_bytes())
        assert (kind, seq, [v[1][0] for v in verdicts]) == ("done", 1, ["indexed"] * 3)
        wait_for(lambda: spy.batches == 1 and spy.idles >= 1, timeout=10, what="collections")
        ours.send_bytes(pack(("stop",)))
        loop.join(10)
    assert not loop.is_alive()
    engine.close()
