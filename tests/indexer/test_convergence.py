"""Property: any permutation, with duplicates, of an instance's event history, in any
batch split, converges on the state of the newest event; a delete stays deleted."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.cells import reads, rows
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.indexer.documents import comparable, instance_document
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.writer import BatchWriter
from cellsight.notifications.envelope import Notification, decode
from tests.support.publishers import CollectingPublisher


@pytest.fixture(scope="module")
def history(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[bytes], dict[str, Any]]]:
    """The real event history of one instance (Cellsight's producer: revisions), and the
    document its final cell row maps to."""
    data = tmp_path_factory.mktemp("history")
    registry = CellRegistry(f"sqlite:///{data / 'api.db'}")
    registry.create_schema()
    cell = registry.add_cell("cell1", f"sqlite:///{data / 'cell1.db'}")
    add_compute_node(registry.cell_engine(cell), "host1", availability_zone="az1")
    add_compute_node(registry.cell_engine(cell), "host2", availability_zone="az1")
    publisher = CollectingPublisher()
    ops = Operations(registry, publisher, publisher_id="test")
    vm = (
        ops.boot(
            BootRequest(
                display_name="vm", flavor="m1.small", project_id="p", user_id="u", tags=["a"]
            )
        )
        .instances[0]
        .uuid
    )
    ops.rename(vm, "renamed")
    ops.set_tags(vm, ["b", "c"])
    ops.power_off(vm)
    ops.power_on(vm)
    ops.resize(vm, "m1.large")
    ops.live_migrate(vm)
    ops.lock(vm, "why")
    ops.unlock(vm)
    ops.delete(vm)
    with registry.cell_engine(cell).connect() as conn:
        row = reads.get_instance(conn, vm)
    assert row is not None
    final = comparable(
        instance_document(rows.row_to_payload(row, cell.uuid), "x.y", row["revision"])
    )
    bodies = [json.dumps(n.to_oslo()).encode() for n in publisher.sent]
    registry.close()
    yield bodies, final


def _nova_history(nova_like_dir: Path) -> tuple[list[bytes], Notification]:
    """Nova's own payloads (no revision): versions come from updated_at and phase."""
    names = [
        "instance-create-start",
        "instance-create-end",
        "instance-update",
        "instance-power_off-end",
        "instance-power_on-end",
        "instance-resize_finish-end",
        "instance-lock",
        "instance-unlock",
        "instance-delete-start",
        "instance-delete-end",
    ]
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    bodies, last = [], None
    for i, name in enumerate(names):
        body = json.loads((nova_like_dir / f"{name}.json").read_text())
        data = body["payload"]["nova_object.data"]
        stamp = t0 + timedelta(microseconds=i * 7)
        if name == "instance-delete-end":
            stamp = t0 + timedelta(microseconds=(i - 1) * 7)  # same instant as delete.start
            data["deleted_at"] = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        data["updated_at"] = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        last = decode(body)
        bodies.append(json.dumps(body).encode())
    assert last is not None
    return bodies, last


def _shuffled(draw: Any, bodies: list[bytes]) -> list[list[bytes]]:
    order = draw(st.permutations(bodies))
    extra = draw(st.lists(st.sampled_from(bodies), max_size=len(bodies)))
    stream = list(order)
    for dup in extra:
        stream.insert(draw(st.integers(0, len(stream))), dup)
    cuts = sorted(draw(st.lists(st.integers(1, len(stream) - 1), max_size=4, unique=True)))
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


@st.composite
def deliveries(draw: Any, bodies: list[bytes]) -> list[list[bytes]]:
    return _shuffled(draw, bodies)


def _apply(tmp: Path, batches: list[list[bytes]]) -> EmbeddedEngine:
    engine = EmbeddedEngine(tmp / f"{uuid.uuid4().hex}.db")
    engine.ensure_ready("instance")
    writer = BatchWriter(engine)
    for batch in batches:
        outcomes = writer.write(batch)
        assert all(o.verdict.value in ("indexed", "stale") for o in outcomes), outcomes
    return engine


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_revisioned_history_converges_on_the_final_row(
    data: st.DataObject, history: tuple[list[bytes], dict[str, Any]], tmp_path: Path
) -> None:
    bodies, final = history
    engine = _apply(tmp_path, data.draw(deliveries(bodies)))
    stored = engine.get("instance", final["uuid"])
    engine.close()
    assert stored is not None
    assert comparable(stored.document) == final
    assert stored.document["deleted"] is True and stored.document["tags"] == ["b", "c"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_nova_history_converges_and_late_updates_never_resurrect(
    data: st.DataObject, nova_like_dir: Path, tmp_path: Path
) -> None:
    bodies, last = _nova_history(nova_like_dir)
    engine = _apply(tmp_path, data.draw(deliveries(bodies)))
    stored = engine.get("instance", last.payload.uuid)  # type: ignore[attr-defined]
    engine.close()
    assert stored is not None
    assert stored.document["event_type"] == "instance.delete.end"
    assert stored.document["deleted"] is True and stored.document["state"] == "deleted"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_nova_history_converges_on_the_newest_events_tags(
    data: st.DataObject, nova_like_dir: Path, tmp_path: Path
) -> None:
    """Nova's action payloads carry no tags: whatever the order, the document ends with
    the tags of the newest event that carried any (here instance.update's)."""
    bodies, _ = _nova_history(nova_like_dir)
    tagged = []
    for i, body in enumerate(bodies):
        message = json.loads(body)
        fields = message["payload"]["nova_object.data"]
        if "tags" in fields:
            fields["tags"] = [f"t{i}"]
            tagged.append(i)
        bodies[i] = json.dumps(message).encode()
    assert len(tagged) >= 2  # create and update: the history has a choice to make
    engine = _apply(tmp_path, data.draw(deliveries(bodies)))
    stored = engine.get("instance", json.loads(bodies[0])["payload"]["nova_object.data"]["uuid"])
    engine.close()
    assert stored is not None
    assert stored.document["event_type"] == "instance.delete.end"
    assert stored.document["tags"] == [f"t{max(tagged)}"]
