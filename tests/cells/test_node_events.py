"""Compute-node notifications: every usage-changing operation announces its nodes, and
the indexer, fed only those notifications (no ``index sync --type node``), holds node
documents equal to the cells' node rows, in any delivery order with duplicates."""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.cells.errors import CellsError
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.nodeevents import (
    NODE_UPDATE,
    ComputeNodeNotFound,
    register_node,
    set_node_state,
)
from cellsight.cells.operations import Operations
from cellsight.cells.schema import compute_nodes
from cellsight.indexer.documents import comparable
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.row_documents import node_row_document
from cellsight.indexer.writer import BatchWriter
from cellsight.notifications.objects import ComputeNodePayload
from tests.support.publishers import CollectingPublisher

HOSTS = ("h1", "h2", "h3")
FLAVORS = ("m1.tiny", "m1.small", "m1.medium", "m1.large", "m1.xlarge")
SMALL_NODE = {"vcpus": 4, "memory_mb": 16384, "local_gb": 200, "cpu_allocation_ratio": 1.0}


def node_rows(registry: CellRegistry, cell: CellMapping) -> list[dict[str, Any]]:
    with registry.cell_engine(cell).connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(compute_nodes)).mappings()]


def _world(tmp: Path) -> tuple[CellRegistry, CellMapping, Operations, CollectingPublisher]:
    registry = CellRegistry(f"sqlite:///{tmp / 'api.db'}")
    registry.create_schema()
    cell = registry.add_cell("cell1", f"sqlite:///{tmp / 'cell1.db'}")
    publisher = CollectingPublisher()
    ops = Operations(registry, publisher, publisher_id="test")
    for host in HOSTS:
        register_node(ops, "cell1", host, availability_zone="az1", **SMALL_NODE)
    return registry, cell, ops, publisher


def test_each_usage_change_announces_the_nodes_it_touched(tmp_path: Path) -> None:
    registry, cell, ops, publisher = _world(tmp_path)
    assert publisher.event_types == [NODE_UPDATE] * 3  # registration
    publisher.take()

    def nodes_sent() -> list[tuple[str, int]]:
        sent = [n for n in publisher.take() if n.event_type == NODE_UPDATE]
        out = []
        for n in sent:
            assert isinstance(n.payload, ComputeNodePayload)
            assert n.payload.cell_uuid == cell.uuid
            out.append((n.payload.host, n.payload.vcpus_used))
        return out

    booted = ops.boot(
        BootRequest(display_name="a", flavor="m1.medium", project_id="p", user_id="u")
    ).instances[0]
    assert nodes_sent() == [(booted.host, 2)]
    ops.resize(booted.uuid, "m1.large")
    assert nodes_sent() == [(booted.host, 4)]
    ops.rename(booted.uuid, "b")  # no usage change: no node event
    assert nodes_sent() == []
    ops.lock(booted.uuid)
    assert nodes_sent() == []
    moved = ops.live_migrate(booted.uuid)
    assert sorted(nodes_sent()) == sorted([(booted.host, 0), (moved.host, 4)])
    ops.delete(booted.uuid)
    assert nodes_sent() == [(moved.host, 0)]
    (disabled,) = set_node_state(ops, "cell1", "h1", disabled=True)
    assert disabled.disabled and nodes_sent() == [("h1", 0)]
    (offline,) = set_node_state(ops, cell.uuid, "h2", offline=True)
    assert offline.offline and not offline.disabled
    with pytest.raises(ComputeNodeNotFound, match="'nope'"):
        set_node_state(ops, "cell1", "nope", disabled=True)
    # Every row change bumped the revision the events carry.
    assert {r["host"]: r["revision"] for r in node_rows(registry, cell)}["h1"] > 1
    registry.close()


def test_a_failed_operation_announces_no_node(tmp_path: Path) -> None:
    registry, _cell, _ops, publisher = _world(tmp_path)
    publisher.take()

    def fail(name: str, conn: sa.Connection) -> None:
        raise RuntimeError("injected")

    failing = Operations(registry, publisher, before_commit=fail)
    with pytest.raises(RuntimeError):
        failing.boot(BootRequest(display_name="x", flavor="m1.tiny", project_id="p", user_id="u"))
    assert publisher.sent == []
    registry.close()


Step = tuple[str, Any, Any]
_steps: st.SearchStrategy[list[Step]] = st.lists(
    st.one_of(
        st.tuples(st.just("boot"), st.sampled_from(FLAVORS), st.none()),
        st.tuples(st.just("delete"), st.integers(0, 20), st.none()),
        st.tuples(st.just("resize"), st.integers(0, 20), st.sampled_from(FLAVORS)),
        st.tuples(st.just("migrate"), st.integers(0, 20), st.none()),
        st.tuples(st.just("disable"), st.sampled_from(HOSTS), st.booleans()),
        st.tuples(st.just("offline"), st.sampled_from(HOSTS), st.booleans()),
    ),
    min_size=1,
    max_size=25,
)


def _run(ops: Operations, steps: list[Step]) -> None:
    booted: list[str] = []
    acts: dict[str, Callable[[Any, Any], Any]] = {
        "boot": lambda f, _: booted.append(
            ops.boot(BootRequest(display_name="vm", flavor=f, project_id="p", user_id="u"))
            .instances[0]
            .uuid
        ),
        "delete": lambda i, _: ops.delete(booted[i % len(booted)]),
        "resize": lambda i, f: ops.resize(booted[i % len(booted)], f),
        "migrate": lambda i, _: ops.live_migrate(booted[i % len(booted)]),
        "disable": lambda h, b: set_node_state(ops, "cell1", h, disabled=b),
        "offline": lambda h, b: set_node_state(ops, "cell1", h, offline=b),
    }
    for name, a, b in steps:
        if name in ("delete", "resize", "migrate") and not booted:
            continue
        # Refused (no room, deleted, same flavor): announces nothing, changes nothing.
        with contextlib.suppress(CellsError):
            acts[name](a, b)


def _deliveries(draw: Any, bodies: list[bytes]) -> list[list[bytes]]:
    stream = list(draw(st.permutations(bodies)))
    for dup in draw(st.lists(st.sampled_from(bodies), max_size=5)):
        stream.insert(draw(st.integers(0, len(stream))), dup)
    cuts = sorted(draw(st.lists(st.integers(1, len(stream) - 1), max_size=3, unique=True)))
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=_steps, data=st.data())
def test_node_documents_equal_node_rows_after_any_operations(
    tmp_path: Path, steps: list[Step], data: st.DataObject
) -> None:
    tmp = tmp_path / uuidlib.uuid4().hex
    tmp.mkdir()
    registry, cell, ops, publisher = _world(tmp)
    _run(ops, steps)
    bodies = [json.dumps(n.to_oslo()).encode() for n in publisher.sent]
    engine = EmbeddedEngine(tmp / "index.db")
    engine.ensure_ready("node")
    engine.ensure_ready("instance")
    writer = BatchWriter(engine)
    for batch in _deliveries(data.draw, bodies):
        outcomes = writer.write(batch)
        assert all(o.verdict.value in ("indexed", "stale") for o in outcomes), outcomes
    rows = node_rows(registry, cell)
    for row in rows:
        stored = engine.get("node", str(row["uuid"]))
        assert stored is not None, row["host"]
        assert comparable(stored.document) == comparable(node_row_document(row, cell.uuid))
    assert engine.count("node") == len(rows)
    engine.close()
    registry.close()


def test_a_bad_node_notification_is_dead_lettered_with_its_reason(tmp_path: Path) -> None:
    registry, _cell, _ops, publisher = _world(tmp_path)
    good = publisher.sent[0].to_oslo()
    bad = json.loads(json.dumps(good))
    message = json.loads(bad["oslo.message"])
    message["payload"]["nova_object.data"]["memory_mb"] = -5
    message["payload"]["nova_object.version"] = "2.0"
    bad["oslo.message"] = json.dumps(message)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("node")
    outcomes = BatchWriter(engine).write([json.dumps(bad).encode(), json.dumps(good).encode()])
    assert outcomes[0].verdict.value == "dead" and "2.0" in (outcomes[0].reason or "")
    assert outcomes[1].verdict.value == "indexed"
    engine.close()
    registry.close()
