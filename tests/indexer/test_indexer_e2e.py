"""End to end: cluster operations → bus → indexer → engine, compared with the cells.

Runs on RabbitMQ and on the embedded Redis bus, against every engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.clients import build_notifier
from cellsight.indexer.engines.base import SearchEngine
from tests.support.drift import index_differences
from tests.support.indexing import PIPELINES, bus_settings, running_indexer, wait_for
from tests.support.publishers import CountingPublisher


def _cluster(data_dir: Path, bus: str) -> tuple[Any, CellRegistry]:
    settings = bus_settings(data_dir, bus)
    registry = CellRegistry.from_settings(settings)
    for name in ("cell1", "cell2"):
        cell = registry.add_cell(name, f"sqlite:///{data_dir / (name + '.db')}")
        for host in ("host1", "host2"):
            add_compute_node(registry.cell_engine(cell), host, availability_zone="az1")
    return settings, registry


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_operations_reach_the_index_equal_to_the_cells(
    bus: str, engine: SearchEngine, tmp_path: Path, pipeline: str
) -> None:
    settings, registry = _cluster(tmp_path / "data", bus)
    notifier = build_notifier(settings)
    publisher = CountingPublisher(notifier)
    ops = Operations(registry, publisher, publisher_id="nova-compute:test")
    booted = []
    for cell, count, project in (("cell1", 5, "p1"), ("cell2", 4, "p2")):
        result = ops.boot(
            BootRequest(
                display_name=f"vm-{cell}",
                flavor="m1.small",
                project_id=project,
                user_id="u1",
                count=count,
                cell=cell,
                tags=["web"],
                metadata={"tier": "gold"},
            )
        )
        booted += [p.uuid for p in result.instances]
    a, b, c, d, e, f, *_ = booted
    ops.rename(a, "renamed")
    ops.update_metadata(a, {"owner": "ops"}, ())
    ops.set_tags(b, ["db", "prod"])
    ops.power_off(c)
    ops.power_on(c)
    ops.reboot(d, hard=True)
    ops.resize(e, "m1.large")
    ops.live_migrate(f)
    ops.lock(b, "maintenance")
    ops.unlock(b)
    ops.delete(d)
    ops.delete(booted[-1])
    engine.ensure_ready("instance")
    with running_indexer(settings, engine, pipeline) as consumer:
        wait_for(lambda: sum(consumer.totals.values()) >= publisher.count, what="all events")
    notifier.close()
    assert consumer.totals["dead"] == 0
    assert consumer.totals["indexed"] + consumer.totals["stale"] == publisher.count
    assert index_differences(registry, engine) == {}
    deleted = engine.get("instance", d)
    assert deleted is not None and deleted.document["deleted"] is True
    assert engine.count("instance") == len(booted)
    registry.close()


def _sample_bodies(nova_like_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(nova_like_dir.glob("*.json"))]


def test_every_sample_indexes_through_the_bus(
    bus: str, nova_like_dir: Path, tmp_path: Path
) -> None:
    from cellsight.indexer.engines.embedded import EmbeddedEngine
    from cellsight.notifications.envelope import decode

    settings, registry = _cluster(tmp_path / "data", bus)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    notifier = build_notifier(settings)
    bodies = _sample_bodies(nova_like_dir)
    # Each sample gets its own instance, so each one's document can be checked.
    expected = {}
    for i, body in enumerate(bodies):
        data = body["payload"]["nova_object.data"]
        if "uuid" in data and body["event_type"].startswith("instance."):
            data["uuid"] = f"00000000-0000-4000-8000-{i:012d}"
            expected[data["uuid"]] = body
        notifier.publish(decode(body))
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: sum(consumer.totals.values()) >= len(bodies), what="all samples")
    notifier.close()
    assert consumer.totals == {"indexed": 14, "stale": 0, "ignored": 1, "dead": 0}
    for uuid, body in expected.items():
        stored = engine.get("instance", uuid)
        assert stored is not None, body["event_type"]
        data = body["payload"]["nova_object.data"]
        doc = stored.document
        assert doc["event_type"] == body["event_type"]
        assert doc["tenant_id"] == data["tenant_id"]
        assert doc["flavor_name"] == data["flavor"]["nova_object.data"]["name"]
        assert doc["deleted"] is (body["event_type"] == "instance.delete.end")
        assert doc["state"] == ("deleted" if doc["deleted"] else data["state"])
    error = engine.get("instance", next(u for u, b in expected.items() if b["priority"] == "ERROR"))
    assert error is not None and error.document["event_type"] == "instance.create.error"
    registry.close()
    engine.close()
