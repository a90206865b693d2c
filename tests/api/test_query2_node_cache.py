"""The node state cache over real SQLite cells read by the real fan-out pool: one round
trip per cell snapshot (counted), TTL on an injected clock, each invalidating event
(the cache then equals a fresh snapshot, and would not without the event), bypass, and
the metrics."""

from __future__ import annotations

import json
import threading
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY as METRICS

from cellsight.api.fanout import FanOut, Saturated
from cellsight.api.query2.evaluate import Deadline
from cellsight.api.query2.node_cache import DEFAULT_TTL, NodeCache, NodeSnapshot
from cellsight.api.query2.nodes import _from_cells
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.nodeevents import NODE_UPDATE, register_node, set_node_state
from cellsight.cells.operations import Operations
from cellsight.cells.schema import compute_nodes
from cellsight.notifications.envelope import Notification
from tests.support.clock import ManualClock

NODE: dict[str, Any] = {"vcpus": 8, "memory_mb": 32768, "local_gb": 400, "availability_zone": "az"}


class Feed:
    """The operations' publisher: every event goes to the cache, as the API's does."""

    def __init__(self) -> None:
        self.cache: NodeCache | None = None
        self.sent: list[Notification] = []

    def publish(self, notification: Notification) -> None:
        self.publish_many([notification])

    def publish_many(self, notifications: Any) -> None:
        for n in notifications:
            self.sent.append(n)
            if self.cache is not None:
                self.cache.observe(n.event_type, n.payload)


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.registry = CellRegistry(f"sqlite:///{tmp / 'api.db'}")
        self.registry.create_schema()
        self.feed = Feed()
        self.ops = Operations(self.registry, self.feed, publisher_id="t")
        self.cells: list[CellMapping] = []
        for name in ("cell1", "cell2"):
            self.cells.append(self.registry.add_cell(name, f"sqlite:///{tmp / name}.db"))
            for host in ("a", "b", "c"):
                register_node(self.ops, name, f"{name}-{host}", **NODE)
        self.fanout = FanOut(cell_timeout=5.0)
        self.reference = FanOut(cell_timeout=5.0)  # its own engines: fresh() is not counted
        self.statements: dict[str, int] = {c.uuid: 0 for c in self.cells}
        for cell in self.cells:
            sa.event.listen(self.fanout.engine(cell), "before_cursor_execute", self._count(cell))
        self.clock = ManualClock()
        self.cache = NodeCache(
            self.registry.list_cells, lambda cells: _from_cells(list(cells), self.fanout),
            clock=self.clock,
        )  # fmt: skip
        self.feed.cache = self.cache

    def _count(self, cell: CellMapping) -> Any:
        def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            # Transaction control (SQLite's emitted BEGIN) carries no data: not a query.
            if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
                self.statements[cell.uuid] += 1

        return count

    def trips(self) -> dict[str, int]:
        """Queries per cell since the last call."""
        out = {self.name(u): n for u, n in self.statements.items()}
        self.statements = dict.fromkeys(self.statements, 0)
        return out

    def name(self, cell_uuid: str) -> str:
        return next(c.name for c in self.cells if c.uuid == cell_uuid)

    def fresh(self) -> list[dict[str, Any]]:
        load = _from_cells(self.cells, self.reference)
        return sorted((d for docs in load.documents.values() for d in docs), key=_uuid)

    def close(self) -> None:
        self.fanout.close()
        self.reference.close()
        self.registry.close()


def _uuid(doc: Any) -> str:
    return str(doc["uuid"])


def docs(snapshot: NodeSnapshot) -> list[dict[str, Any]]:
    return [dict(d) for d in snapshot.documents]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def test_a_snapshot_is_one_round_trip_per_cell_and_then_memory(rig: Rig) -> None:
    first = rig.cache.get()
    assert len(first.documents) == 6
    assert rig.trips() == {"cell1": 1, "cell2": 1}
    assert docs(rig.cache.get()) == docs(first)
    assert rig.trips() == {"cell1": 0, "cell2": 0}
    assert (rig.cache.hits, rig.cache.misses, rig.cache.loads) == (1, 1, 1)


def test_entries_expire_after_the_ttl_default_ten_minutes(rig: Rig) -> None:
    assert DEFAULT_TTL == 600.0
    rig.cache.get()
    rig.trips()
    rig.clock.now += DEFAULT_TTL - 1
    rig.cache.get()
    assert rig.trips() == {"cell1": 0, "cell2": 0}
    rig.clock.now += 1
    rig.cache.get()
    assert rig.trips() == {"cell1": 1, "cell2": 1}


def _changed_behind_the_cache(rig: Rig, host: str) -> None:
    """A change no event announces (as another process's write would look)."""
    with rig.registry.cell_engine(rig.cells[0]).begin() as conn:
        conn.execute(
            compute_nodes.update().where(compute_nodes.c.host == host).values(vcpus_used=3)
        )


def test_a_node_event_drops_that_node_and_rereads_only_its_cell(rig: Rig) -> None:
    rig.cache.get()
    rig.trips()
    set_node_state(rig.ops, "cell1", "cell1-a", offline=True)
    assert rig.feed.sent[-1].event_type == NODE_UPDATE
    assert rig.cache.invalidations == 1
    got = docs(rig.cache.get())
    assert rig.trips() == {"cell1": 1, "cell2": 0}
    assert got == rig.fresh()
    assert [d["offline"] for d in got if d["host"] == "cell1-a"] == [True]


def test_operations_drop_the_nodes_they_touch(rig: Rig) -> None:
    rig.cache.get()
    booted = rig.ops.boot(
        BootRequest(display_name="x", flavor="m1.small", project_id="p", user_id="u")
    ).instances[0]
    assert docs(rig.cache.get()) == rig.fresh()
    rig.ops.resize(booted.uuid, "m1.medium")
    assert docs(rig.cache.get()) == rig.fresh()
    rig.ops.delete(booted.uuid)
    assert docs(rig.cache.get()) == rig.fresh()


def test_live_migration_drops_the_whole_cache(rig: Rig) -> None:
    booted = rig.ops.boot(
        BootRequest(display_name="x", flavor="m1.small", project_id="p", user_id="u")
    ).instances[0]
    rig.cache.get()
    rig.trips()
    before = rig.cache.invalidations
    rig.ops.live_migrate(booted.uuid)
    assert rig.cache.invalidations > before
    assert docs(rig.cache.get()) == rig.fresh()
    assert rig.trips() == {"cell1": 1, "cell2": 1}  # every cell read again


@pytest.mark.parametrize(
    "event_type",
    ["instance.evacuate", "instance.resize_finish.end", "instance.live_migration_post.end"],
)
def test_evacuation_and_cross_host_resize_drop_the_whole_cache(rig: Rig, event_type: str) -> None:
    """No operation here evacuates or resizes across hosts: the event arrives from the bus
    after another process moved load between nodes."""
    rig.cache.get()
    _changed_behind_the_cache(rig, "cell1-b")
    assert docs(rig.cache.get()) != rig.fresh()  # the cache alone cannot know
    rig.cache.observe(event_type, None)
    assert docs(rig.cache.get()) == rig.fresh()


def test_unrelated_events_keep_the_cache(rig: Rig) -> None:
    rig.cache.get()
    rig.trips()
    for event in ("instance.update", "instance.power_off.end", "instance.lock"):
        rig.cache.observe(event, None)
    rig.cache.get()
    assert rig.trips() == {"cell1": 0, "cell2": 0} and rig.cache.invalidations == 0


def test_bypass_snapshots_every_cell_and_refills(rig: Rig) -> None:
    rig.cache.get()
    _changed_behind_the_cache(rig, "cell1-c")
    assert docs(rig.cache.get()) != rig.fresh()
    rig.trips()
    assert docs(rig.cache.get(bypass=True)) == rig.fresh()
    assert rig.trips() == {"cell1": 1, "cell2": 1}
    assert docs(rig.cache.get()) == rig.fresh()  # refilled: served from memory
    assert rig.trips() == {"cell1": 0, "cell2": 0}
    assert docs(rig.cache.refresh()) == rig.fresh()


def test_a_new_cell_is_snapshotted_alone(rig: Rig, tmp_path: Path) -> None:
    rig.cache.get()
    rig.trips()
    rig.cells.append(rig.registry.add_cell("cell3", f"sqlite:///{tmp_path / 'cell3.db'}"))
    register_node(rig.ops, "cell3", "cell3-a", **NODE)
    rig.statements[rig.cells[-1].uuid] = 0
    sa.event.listen(
        rig.fanout.engine(rig.cells[-1]), "before_cursor_execute", rig._count(rig.cells[-1])
    )
    assert docs(rig.cache.get()) == rig.fresh()
    assert rig.trips() == {"cell1": 0, "cell2": 0, "cell3": 1}


def test_concurrent_misses_share_one_snapshot(rig: Rig) -> None:
    threads = [threading.Thread(target=rig.cache.get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rig.cache.loads == 1 and rig.trips() == {"cell1": 1, "cell2": 1}


def test_metrics_count_hits_misses_and_invalidations(rig: Rig) -> None:
    def value(name: str, **labels: str) -> float:
        return METRICS.get_sample_value(name, labels) or 0.0

    hits, misses = (
        value("cellsight_node_cache_hits_total"),
        value("cellsight_node_cache_misses_total"),
    )
    dropped = value("cellsight_node_cache_invalidations_total", scope="node")
    rig.cache.get()
    rig.cache.get()
    set_node_state(rig.ops, "cell2", "cell2-a", disabled=True)
    assert value("cellsight_node_cache_hits_total") == hits + 1
    assert value("cellsight_node_cache_misses_total") == misses + 1
    assert value("cellsight_node_cache_invalidations_total", scope="node") == dropped + 1


def test_negative_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="ttl"):
        NodeCache(list, lambda cells: json.loads("{}"), ttl=-1)


def test_a_remembered_selection_never_outlives_its_snapshot(rig: Rig) -> None:
    from cellsight.api.query2.nodes import select
    from cellsight.api.query2.sexpr import parse_filter

    tree = parse_filter("node", ["?", "offline"])
    assert select(rig.cache.get(), tree, Deadline(60.0)) == []
    assert rig.cache.get() is rig.cache.get()  # warm: the same immutable snapshot
    set_node_state(rig.ops, "cell2", "cell2-b", offline=True)
    assert [d["host"] for d in select(rig.cache.get(), tree, Deadline(60.0))] == ["cell2-b"]
    rig.clock.now += DEFAULT_TTL
    assert [d["host"] for d in select(rig.cache.get(), tree, Deadline(60.0))] == ["cell2-b"]


def test_a_failing_read_of_dropped_cells_falls_back_to_the_usual_one(rig: Rig) -> None:
    """The cells' own read of dropped entries raising (the fan-out pool full: Saturated)
    made every node query fail until it stopped; those cells are read as usual."""
    tried: list[str] = []

    def busy(cells: Any) -> Any:
        tried.extend(c.name for c in cells)
        raise Saturated(retry_after=1)

    cache = _cache_with_truth(rig, busy)
    cache.get()
    set_node_state(rig.ops, "cell1", "cell1-a", offline=True)
    got = docs(cache.get())
    assert tried == ["cell1"] and got == rig.fresh()
    assert [d["offline"] for d in got if d["host"] == "cell1-a"] == [True]


def test_a_cell_read_wins_over_a_newer_entry(rig: Rig) -> None:
    """An entry is kept over an older document from the index only: a cell's database
    restored from a backup has lower revisions, and its own read is the truth."""
    rig.cache.get()
    c = compute_nodes.c
    engine = rig.registry.cell_engine(rig.cells[0])
    with engine.begin() as conn:
        conn.execute(compute_nodes.update().values(revision=c.revision - 1, offline=True))
    assert docs(rig.cache.refresh()) == rig.fresh()
    assert all(d["offline"] for d in docs(rig.cache.get()) if d["cell_uuid"] == rig.cells[0].uuid)


def test_a_filter_never_selects_a_node_by_a_figure_its_answer_withholds(rig: Rig) -> None:
    """A node of a cell that did not answer shows its live figures as status 2 and an
    offline one as status 4; a filter on those figures selected them by the old values
    all the same (an adversarial probe: ``memory_mb_free == <its old value>`` returned
    the node with ``[2, null]``). Identity fields still select them."""
    from cellsight.api.fanout import SkippedCell
    from cellsight.api.query2.nodes import select
    from cellsight.api.query2.sexpr import parse_filter

    set_node_state(rig.ops, "cell2", "cell2-b", offline=True)
    fresh = rig.cache.get()
    cell1 = rig.cells[0]
    gone = NodeSnapshot.of(
        fresh.documents, fresh.source, (SkippedCell(cell1.uuid, cell1.name, "error"),)
    )
    free = {d["host"]: d["memory_mb_free"] for d in fresh.documents}
    assert len(set(free.values())) == 1  # every node alike: one value selects them all

    def hosts(snapshot: NodeSnapshot, *tree: Any) -> list[str]:
        chosen = select(snapshot, parse_filter("node", list(tree)), Deadline(60.0))
        return sorted(d["host"] for d in chosen)

    equal = ["==", "memory_mb_free", free["cell1-a"]]
    answering = ["cell1-a", "cell1-b", "cell1-c", "cell2-a", "cell2-c"]
    assert hosts(fresh, *equal) == answering  # all but the offline one
    assert hosts(gone, *equal) == ["cell2-a", "cell2-c"]
    assert hosts(gone, "!", equal) == []  # unknown is neither true nor false
    assert hosts(gone, "==", "cell", "cell1") == ["cell1-a", "cell1-b", "cell1-c"]
    assert hosts(gone, "?", "offline") == ["cell2-b"]


def test_events_naming_unregistered_cells_are_not_kept(rig: Rig) -> None:
    """A review: each event naming a cell never read was remembered until that cell was
    read, and a cell never registered never is: one entry an event, for ever."""
    for _ in range(100):
        rig.cache.invalidate_node(str(uuidlib.uuid4()), str(uuidlib.uuid4()))
    rig.cache.get()
    assert rig.cache._truth == set()


class HeldRead:
    """The cells' own read (``truth``), done, then held until ``release``: a bypass
    waiting on a cell that is slow to answer, its answer already read."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, cells: Any) -> Any:
        load = _from_cells(list(cells), self.rig.fanout)
        self.entered.set()
        assert self.release.wait(30), "never released"
        return load


def _cache_with_truth(rig: Rig, truth: Any) -> NodeCache:
    """The rig's cache, with ``truth`` as its cells' own read; fed the rig's events."""
    cache = NodeCache(
        rig.registry.list_cells,
        lambda cells: _from_cells(list(cells), rig.fanout),
        truth=truth,
        clock=rig.clock,
    )
    rig.feed.cache = cache
    return cache


def _cache_with_held_truth(rig: Rig) -> tuple[NodeCache, HeldRead]:
    held = HeldRead(rig)
    return _cache_with_truth(rig, held), held


def test_a_bypass_waiting_on_its_cells_holds_up_no_cached_answer(rig: Rig) -> None:
    """A bypass read the cells under the cache's lock: a dead cell held every other node
    query for its cell_timeout (a review)."""
    cache, held = _cache_with_held_truth(rig)
    expected = docs(cache.get())
    bypass = threading.Thread(target=cache.get, kwargs={"bypass": True})
    bypass.start()
    assert held.entered.wait(30)
    hits = cache.hits
    assert docs(cache.get()) == expected  # answered while the bypass still waits
    assert cache.hits == hits + 1 and bypass.is_alive() and not held.release.is_set()
    held.release.set()
    bypass.join(30)
    assert not bypass.is_alive()


def test_an_event_during_a_bypass_leaves_its_cell_to_be_read_again(rig: Rig) -> None:
    """A bypass's answer read before a node event is kept, but does not vouch for the
    cell: the next request reads it again and sees the change."""
    cache, held = _cache_with_held_truth(rig)
    cache.get()
    answers: list[NodeSnapshot] = []
    bypass = threading.Thread(target=lambda: answers.append(cache.get(bypass=True)))
    bypass.start()
    assert held.entered.wait(30)
    set_node_state(rig.ops, "cell1", "cell1-a", offline=True)  # observed by the cache
    held.release.set()
    bypass.join(30)
    assert [d["offline"] for d in answers[0].documents if d["host"] == "cell1-a"] == [False]
    got = docs(cache.get())
    assert got == rig.fresh()
    assert [d["offline"] for d in got if d["host"] == "cell1-a"] == [True]


def test_a_bypass_with_no_cells_answers_none(tmp_path: Path) -> None:
    """``nodes refresh`` on an API without cells was a 500 (nothing read, nothing to say
    where it came from)."""
    cache = NodeCache(lambda: [], lambda cells: pytest.fail("nothing to read"))
    snapshot = cache.get(bypass=True)
    assert snapshot.documents == () and snapshot.complete


def _bypass_during(cache: NodeCache, held: HeldRead, meanwhile: Any) -> NodeSnapshot:
    """A bypass whose cells' read is done and held while ``meanwhile()`` runs."""
    answers: list[NodeSnapshot] = []
    bypass = threading.Thread(target=lambda: answers.append(cache.get(bypass=True)))
    bypass.start()
    assert held.entered.wait(30)
    meanwhile()
    held.release.set()
    bypass.join(30)
    return answers[0]


def test_an_event_during_a_cold_caches_bypass_is_not_lost(rig: Rig) -> None:
    """A review: the event, on a cache that had read nothing, changed nothing the bypass
    looked at, and its answer then vouched for the cell for a whole TTL."""
    cache, held = _cache_with_held_truth(rig)
    _bypass_during(cache, held, lambda: set_node_state(rig.ops, "cell1", "cell1-a", offline=True))
    got = docs(cache.get())
    assert got == rig.fresh() and [d["offline"] for d in got if d["host"] == "cell1-a"] == [True]


def test_a_second_event_during_a_bypass_is_not_lost(rig: Rig) -> None:
    """The first event had dropped the cell already: the second changed nothing the
    bypass looked at either."""
    cache, held = _cache_with_held_truth(rig)
    cache.get()
    set_node_state(rig.ops, "cell1", "cell1-a", offline=True)  # drops cell1
    _bypass_during(cache, held, lambda: set_node_state(rig.ops, "cell1", "cell1-a", offline=False))
    got = docs(cache.get())
    assert got == rig.fresh() and [d["offline"] for d in got if d["host"] == "cell1-a"] == [False]


def test_a_read_during_a_bypass_leaves_the_cells_trusted(rig: Rig) -> None:
    """A review: any other read during a bypass sent every cell to its database again."""
    cache, held = _cache_with_held_truth(rig)
    cache.get()
    _bypass_during(cache, held, cache.warm)
    rig.trips()
    assert docs(cache.get()) == rig.fresh()
    assert rig.trips() == {"cell1": 0, "cell2": 0}  # served from memory
