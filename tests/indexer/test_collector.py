"""The cycle collector between batches (``cellsight.indexer.collector``): its schedule on
an injected clock, that it frees garbage cycles at a batch's end, and that a consumer
that owns its process turns automatic collection off only while it runs."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.indexer.collector import MIDDLE_EVERY, BatchCollector
from cellsight.indexer.engines.embedded import EmbeddedEngine
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
    with BatchCollector(full_every=60.0, clock=clock) as collector:
        generations = [collector.batch_done() for _ in range(MIDDLE_EVERY * 2)]
        assert generations == ([0] * (MIDDLE_EVERY - 1) + [1]) * 2
        assert collector.idle() is None
        clock.now += 60.0
        assert collector.batch_done() == 2
        assert collector.batch_done() == 0  # the full pass's clock restarted
        assert collector.idle() is None
        clock.now += 59.9
        assert collector.idle() is None
        clock.now += 0.1
        assert collector.idle() == 2
        assert collector.idle() is None


def test_a_garbage_cycle_lives_until_the_batch_ends(gc_restored: None) -> None:
    with BatchCollector() as collector:
        ref = _garbage_cycle()
        assert ref() is not None  # no automatic pass freed it
        collector.batch_done()
        assert ref() is None


def test_a_process_owning_consumer_collects_only_while_it_runs(
    each_bus: Settings, tmp_path: Path, gc_restored: None
) -> None:
    gc.enable()
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    goods = [poison.good(seed=300 + i) for i in range(30)]
    wire = [novagen.body(g) for g in goods]
    bodies = [*wire[:15], b"\xff{ not json", *wire[15:]]  # one dead letter among them
    with running_indexer(each_bus, engine, "process") as consumer:
        wait_for(lambda: not gc.isenabled(), timeout=10, what="collection off")
        publish(each_bus, bodies)
        wait_for(lambda: consumer.acked >= len(bodies), timeout=60, what="all acked")
        assert not gc.isenabled()
        assert consumer.totals["dead"] == 1
    assert gc.isenabled()
    engine.refresh("instance")
    assert engine.count("instance") == len(goods)
