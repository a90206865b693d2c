"""The demo's live stream drives every kind of operation it promises, through the same
``Operations`` as ``cellsight ops``, reservations included (reserve, then commit)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import register_node
from cellsight.cells.operations import Operations
from cellsight.cells.reads import get_instance
from cellsight.cli.demo_live import LiveStream
from cellsight.notifications.payloads import InstancePayload
from tests.support.publishers import CollectingPublisher

NODE = {"vcpus": 64, "memory_mb": 262144, "local_gb": 4000}


def test_the_stream_reserves_then_commits_and_runs_every_kind(tmp_path: Path) -> None:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    publisher = CollectingPublisher()
    ops = Operations(registry, publisher, publisher_id="test")
    for host in ("h1", "h2"):
        register_node(ops, "cell1", host, availability_zone="az1", **NODE)
    stream = LiveStream(ops, registry, interval=0.0, seed=7)
    stream._load_pool()
    for _ in range(400):
        stream.step()

    assert {"boot", "delete", "reserve", "commit", "rename", "resize"} <= set(stream.done)
    reserved = {
        cast(InstancePayload, n.payload).uuid
        for n in publisher.sent
        if n.event_type == "instance.reserve"
    }
    created = {
        cast(InstancePayload, n.payload).uuid
        for n in publisher.sent
        if n.event_type == "instance.create.end"
    }
    committed = reserved & created
    assert len(committed) == stream.done["commit"] > 0
    with registry.cell_engine(cell).connect() as conn:
        for uuid in committed:
            row = get_instance(conn, uuid)
            assert row is not None and not row["forthcoming"]
    registry.close()
