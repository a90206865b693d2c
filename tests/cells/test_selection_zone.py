"""A ``Selection``'s availability zone, as Nova's ``Selection.from_host_state`` sets it:
the node's zone, or ``default_availability_zone`` ("nova" unless set) for a node in
none; the setting reaches the scheduler from the entry points (the CLI, the API)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cellsight.cells.database import connect
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.cells.reads import iter_instances
from cellsight.cells.reservations import Reservations
from cellsight.cells.scheduler import Scheduler
from cellsight.cli import app
from cellsight.settings import ConfigError, load_settings
from tests.support.api_world import World, make_client
from tests.support.publishers import CollectingPublisher
from tests.support.query2_world import ADMIN, state

# Each node has room for the flavor; the roomier one is chosen, the other an alternate.
NODE: dict[str, Any] = {
    "vcpus": 8,
    "memory_mb": 32768,
    "local_gb": 400,
    "cpu_allocation_ratio": 1.0,
}


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[CellRegistry]:
    """One SQLite cell: ``bare`` in no zone (the roomier: chosen first), ``zoned`` in az1."""
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    engine = registry.cell_engine(cell)
    add_compute_node(engine, "bare", availability_zone=None, **{**NODE, "memory_mb": 65536})
    add_compute_node(engine, "zoned", availability_zone="az1", **NODE)
    yield registry
    registry.close()


def zones(scheduler: Scheduler) -> dict[str, str | None]:
    (picks,) = scheduler.select_destinations(get_flavor("m1.small"))
    assert [s.service_host for s in picks] == ["bare", "zoned"]  # chosen, then alternate
    return {s.service_host: s.availability_zone for s in picks}


def test_a_node_in_no_zone_is_in_the_default_zone(registry: CellRegistry) -> None:
    assert zones(Scheduler(registry)) == {"bare": "nova", "zoned": "az1"}  # Nova's default
    edge = Scheduler(registry, default_availability_zone="edge")
    assert zones(edge) == {"bare": "edge", "zoned": "az1"}
    assert zones(Scheduler(registry, default_availability_zone=None)) == {
        "bare": None,
        "zoned": "az1",
    }


def test_the_reservation_takes_its_selection_zone(registry: CellRegistry) -> None:
    ops = Operations(registry, CollectingPublisher(), default_availability_zone="edge")
    result = Reservations(ops).reserve(flavor="m1.small")
    assert [s.availability_zone for s in result.selections] == ["edge", "az1"]
    assert result.payload is not None
    assert (result.payload.host, result.payload.availability_zone) == ("bare", "edge")


def test_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CELLSIGHT_DEFAULT_AVAILABILITY_ZONE", raising=False)
    assert load_settings(data_dir=tmp_path).default_availability_zone == "nova"
    monkeypatch.setenv("CELLSIGHT_DEFAULT_AVAILABILITY_ZONE", "edge")
    assert load_settings(data_dir=tmp_path).default_availability_zone == "edge"
    monkeypatch.setenv("CELLSIGHT_DEFAULT_AVAILABILITY_ZONE", "")  # empty: null, as before
    assert load_settings(data_dir=tmp_path).default_availability_zone is None
    monkeypatch.setenv("CELLSIGHT_DEFAULT_AVAILABILITY_ZONE", "z" * 256)  # Nova's String(255)
    with pytest.raises(ConfigError, match="CELLSIGHT_DEFAULT_AVAILABILITY_ZONE"):
        load_settings(data_dir=tmp_path)


def test_the_api_passes_the_setting_to_the_scheduler(
    registry: CellRegistry, tmp_path: Path
) -> None:
    client = make_client(
        tmp_path / "api", World(registry, "sqlite"), default_availability_zone="edge"
    )
    with client:
        state(client).publisher = CollectingPublisher()
        made = client.post(
            "/v2.1/reservations", json={"reservation": {"flavor": "m1.small"}}, headers=ADMIN
        )
    assert made.status_code == 201, made.text
    body = made.json()
    assert [s["availability_zone"] for s in body["selections"]] == ["edge", "az1"]
    assert body["reservation"]["availability_zone"] == "edge"


def test_the_cli_passes_the_setting_to_the_scheduler(
    registry: CellRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLSIGHT_API_DB_URL", f"sqlite:///{tmp_path / 'api.db'}")
    monkeypatch.setenv("CELLSIGHT_DEFAULT_AVAILABILITY_ZONE", "edge")
    (tmp_path / "data").mkdir()  # its bus's, as the indexer made it (a missing one: usage)
    done = CliRunner().invoke(
        app, ["--data-dir", str(tmp_path / "data"), "ops", "reserve", "--flavor", "m1.small"]
    )
    assert done.exit_code == 0, done.output
    (cell,) = registry.list_cells()
    with connect(registry.cell_engine(cell)) as conn:
        (row,) = list(iter_instances(conn))
    assert (row["host"], row["availability_zone"]) == ("bare", "edge")


def test_every_placement_on_a_node_in_no_zone_records_the_default_zone(
    registry: CellRegistry,
) -> None:
    """As Nova's conductor (``get_host_availability_zone``): a host named by the request,
    a live migration's destination and a zone filter all read the default zone."""
    ops = Operations(registry, CollectingPublisher(), default_availability_zone="edge")
    by_host = Reservations(ops).reserve(flavor="m1.small", host="bare")
    assert by_host.payload is not None and by_host.payload.availability_zone == "edge"
    # A zone request for the default zone takes the node in none.
    (picks,) = ops.scheduler.select_destinations(get_flavor("m1.small"), availability_zone="edge")
    assert [s.service_host for s in picks] == ["bare"]
    (only_az1,) = ops.scheduler.select_destinations(get_flavor("m1.small"), availability_zone="az1")
    assert [s.service_host for s in only_az1] == ["zoned"]
    request = BootRequest(
        display_name="vm", flavor="m1.small", project_id="p", user_id="u", availability_zone="az1"
    )
    (booted,) = ops.boot(request).instances
    assert (booted.host, booted.availability_zone) == ("zoned", "az1")
    moved = ops.live_migrate(booted.uuid, "bare")
    assert (moved.host, moved.availability_zone) == ("bare", "edge")
