"""The first Selection of an answer is the host the instance went to. A probe: racing
reservations landed on h2 and h3 while each answer named h1 first (with h1's node in its
allocation request): each had been picked [h1, h2, h3], and h1 had filled up before all
but one claimed. The answer now starts at the host claimed; the hosts before it, full,
are no alternates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import register_node
from cellsight.cells.operations import Operations
from cellsight.cells.reads import get_instance
from cellsight.cells.reservations import Reservations
from cellsight.notifications.objects import Selection
from tests.support.publishers import CollectingPublisher

# Room for one m1.small each.
NODE = {"vcpus": 1, "memory_mb": 2048, "local_gb": 20, "cpu_allocation_ratio": 1.0}


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[Operations]:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    ops = Operations(registry, CollectingPublisher(), publisher_id="test")
    for host in ("h1", "h2", "h3"):
        register_node(ops, "cell1", host, **NODE)
    yield ops
    registry.close()


def _picked_then_filled(ops: Operations, monkeypatch: pytest.MonkeyPatch) -> list[Selection]:
    """The scheduler's answer as it was before its first host filled up, answered again."""
    (picked,) = ops.scheduler.select_destinations(get_flavor("m1.small"), cell="cell1")
    assert len(picked) == 3
    Reservations(ops).reserve(flavor="m1.small", host=picked[0].service_host)
    monkeypatch.setattr(ops.scheduler, "select_destinations", lambda *a, **k: [list(picked)])
    return picked


def test_a_reservation_answers_the_host_it_claimed_first(
    ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    picked = _picked_then_filled(ops, monkeypatch)
    result = Reservations(ops).reserve(flavor="m1.small", cell="cell1")
    with ops.registry.cell_engine(result.cell).connect() as conn:
        row: Any = get_instance(conn, result.uuid)
    assert row["host"] == picked[1].service_host
    assert [s.service_host for s in result.selections] == [s.service_host for s in picked[1:]]
    assert result.selections[0].compute_node_uuid == picked[1].compute_node_uuid


def test_a_boot_answers_the_host_it_claimed_first(
    ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    picked = _picked_then_filled(ops, monkeypatch)
    result = ops.boot(BootRequest("vm", "m1.small", "p", "u"))
    (instance,) = result.instances
    assert instance.host == picked[1].service_host
    (choices,) = result.selections
    assert [s.service_host for s in choices] == [s.service_host for s in picked[1:]]
