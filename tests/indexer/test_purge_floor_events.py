"""An event older than the purge floor for an instance without a document is dropped
only if a purge may have removed that instance: deleted before the floor in its cell,
without a row there, or mapped to no cell. A live instance's is written.

Found from outside (a crash-consistency probe): every such event was dropped, counted
as stale, so live servers whose document had never been written (their create
arrived late after a purge, or they came from ``cells seed --notify`` with old
timestamps) stayed missing from an index marked synced.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from cellsight.cells.database import Engines
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.purge import raise_floor
from cellsight.indexer.writer import BatchWriter
from tests.support.publishers import CollectingPublisher


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[CellRegistry, EmbeddedEngine, Operations]]:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}", Engines(connect_timeout=5))
    registry.create_schema()
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    add_compute_node(registry.cell_engine(cell), "h1", availability_zone="az1")
    engine = EmbeddedEngine(tmp_path / "index.db", prefix=f"f{uuid.uuid4().hex[:8]}")
    engine.ensure_ready("instance")
    yield registry, engine, Operations(registry, CollectingPublisher(), publisher_id="t")
    engine.close()
    registry.close()


def _bodies(ops: Operations) -> list[bytes]:
    sent: Any = ops.publisher
    return [orjson.dumps(n.to_oslo()) for n in sent.sent if n.event_type.startswith("instance.")]


def test_events_below_the_floor_are_dropped_only_for_purged_instances(
    world: tuple[CellRegistry, EmbeddedEngine, Operations],
) -> None:
    registry, engine, ops = world
    live = ops.boot(BootRequest("live", "m1.small", "p1", "u1")).instances[0].uuid
    gone = ops.boot(BootRequest("gone", "m1.small", "p1", "u1")).instances[0].uuid
    ops.delete(gone)
    bodies = _bodies(ops)
    # A floor above every event: each is "older than the floor", none has a document.
    raise_floor(engine, registry, datetime.now(UTC) + timedelta(hours=1))
    writer = BatchWriter(engine, cell_resolver=registry, record_metrics=False)
    outcomes = writer.write(bodies)
    engine.refresh("instance")
    stored = engine.get("instance", live)
    assert stored is not None and stored.document["display_name"] == "live"
    assert engine.get("instance", gone) is None  # deleted before the floor: purged
    for body, outcome in zip(bodies, outcomes, strict=True):
        dropped = outcome.reason_code == "below_purge_floor"
        assert dropped == (gone.encode() in body), (body[:120], outcome)

    # Without the cells to ask, the floor keeps every such event out, as it did.
    fresh = EmbeddedEngine(engine.path.parent / "other.db", prefix="o")
    try:
        fresh.ensure_ready("instance")
        raise_floor(fresh, None, datetime.now(UTC) + timedelta(hours=1))
        BatchWriter(fresh, record_metrics=False).write(bodies)
        fresh.refresh("instance")
        assert fresh.get("instance", live) is None
    finally:
        fresh.close()


def test_an_instance_mapped_to_no_cell_counts_as_purged(
    world: tuple[CellRegistry, EmbeddedEngine, Operations],
) -> None:
    registry, _, _ = world
    floor = datetime.now(UTC) + timedelta(hours=1)
    assert registry.purged_before([str(uuid.uuid4())], floor) != set()
