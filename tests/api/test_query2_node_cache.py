"""The node state cache: TTL, refresh on expiry, single flight, invalidation on error."""

from __future__ import annotations

import threading
import time

import pytest

from api.fanout import SkippedCell
from api.node_cache import NodeCache, NodeSnapshot


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _node(name: str, *, offline: bool = False) -> dict[str, object]:
    return {"uuid": name, "host": name, "hypervisor_hostname": f"{name}.hv", "offline": offline}


class Loader:
    def __init__(self) -> None:
        self.calls = 0
        self.fail: Exception | None = None
        self.skipped: tuple[SkippedCell, ...] = ()
        self.nodes = [_node("a"), _node("b", offline=True)]

    def __call__(self) -> NodeSnapshot:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return NodeSnapshot.of(list(self.nodes), "cells", self.skipped)


def test_serves_from_memory_until_the_ttl_passes() -> None:
    clock, loader = Clock(), Loader()
    cache = NodeCache(loader, ttl=5.0, clock=clock)
    first = cache.get()
    clock.now += 4.9
    assert cache.get() is first and loader.calls == 1
    loader.nodes = [_node("c")]
    clock.now += 0.2
    refreshed = cache.get()
    assert loader.calls == 2 and [d["uuid"] for d in refreshed.documents] == ["c"]


def test_offline_lookup_by_host_and_node() -> None:
    snapshot = NodeCache(Loader(), clock=Clock()).get()
    assert snapshot.is_offline("b", "b.hv")
    assert not snapshot.is_offline("a", "a.hv")
    assert snapshot.is_offline("b", None)  # no node name: the host decides
    assert not snapshot.is_offline(None, None) and not snapshot.is_offline("zz", "zz.hv")


def test_a_failed_load_invalidates_and_raises() -> None:
    clock, loader = Clock(), Loader()
    cache = NodeCache(loader, ttl=5.0, clock=clock)
    cache.get()
    clock.now += 6
    loader.fail = RuntimeError("cells down")
    with pytest.raises(RuntimeError, match="cells down"):
        cache.get()
    loader.fail = None
    cache.get()  # nothing stale was kept: this loads again
    assert loader.calls == 3


def test_partial_loads_are_served_but_not_kept() -> None:
    clock, loader = Clock(), Loader()
    loader.skipped = (SkippedCell("c2-uuid", "cell2", "timeout"),)
    cache = NodeCache(loader, clock=clock)
    assert not cache.get().complete
    assert not cache.get().complete and loader.calls == 2  # retried at once
    loader.skipped = ()
    assert cache.get().complete and cache.get().complete and loader.calls == 3


def test_invalidate_forces_a_reload() -> None:
    loader = Loader()
    cache = NodeCache(loader, clock=Clock())
    cache.get()
    cache.invalidate()
    cache.get()
    assert loader.calls == 2


def test_concurrent_requests_share_one_load() -> None:
    gate = threading.Event()

    def slow() -> NodeSnapshot:
        gate.wait(5)
        return NodeSnapshot.of([_node("a")], "index")

    cache = NodeCache(slow, ttl=60)
    threads = [threading.Thread(target=cache.get) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    gate.set()
    for t in threads:
        t.join(5)
    assert cache.loads == 1


def test_negative_ttl_is_refused() -> None:
    with pytest.raises(ValueError):
        NodeCache(Loader(), ttl=-1)
