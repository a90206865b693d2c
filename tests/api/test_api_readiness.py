"""The API starts whatever the search engine's state, serves by fan-out, says so on
``/readyz``, and switches to the index once a background probe finds it synced.

The engine is a real OpenSearch-compatible server (osmem) behind the TCP proxy of the
safe-connect tests, stopped (connections refused) while the API starts. The embedded
engine's missing and corrupt files are the other starting states. ``TestClient`` is
entered as a context manager so the app's lifespan (and its prober) runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.headers import PATH, SKIPPED_CELLS
from cellsight.api.routes.health import READY_TTL, CellStates
from cellsight.cells.mappings import CellRegistry
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from tests.api.test_api_safe_connect import Proxy, proxied  # noqa: F401 (fixture)
from tests.support.api_world import ADMIN, World, api_settings, build_world, load_index
from tests.support.clock import ManualClock

FAST = {"safe_connect_cooldown": 0.2, "index_probe_interval": 0.2}


def until(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll ``check`` until it returns something truthy (the prober runs on its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_starts_with_the_engine_unreachable_then_switches_to_the_index(
    proxied: tuple[Proxy, str],  # noqa: F811
    sqlite_world: World,
    tmp_path: Path,
) -> None:
    proxy, url = proxied
    prefix = f"r{uuid.uuid4().hex[:8]}"
    loader = OpenSearchEngine(url, prefix=prefix, timeout=5.0)
    load_index(loader, sqlite_world)
    loader.close()
    proxy.stop()  # the engine is unreachable from here on

    settings = api_settings(
        tmp_path, search_url=url, index_prefix=prefix, search_timeout=1.0, **FAST
    )
    app = create_app(settings, registry=sqlite_world.registry)
    with TestClient(app) as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=5", headers=ADMIN)
        assert listing.status_code == 200 and listing.headers[PATH] == "fanout"
        ready = until(lambda: (r := client.get("/readyz").json())["safe_connect"]["flag"] and r)
        assert ready["status"] == "ready" and ready["path"] == "fanout"
        assert ready["index"]["engine"] == "not connected"
        assert ready["index"]["probe"]["last_result"].startswith("unavailable")
        assert ready["safe_connect"]["next_probe_in"] is not None
        assert {c["state"] for c in ready["cells"]} == {"up"} and len(ready["cells"]) == 3
        assert client.get("/healthz").status_code == 200
        outage = client.get("/metrics").text
        assert "cellsight_api_safe_connect_active 1.0" in outage
        assert 'cellsight_api_request_seconds_count{path="fanout"}' in outage

        proxy.start()  # the engine is back on the same port
        back = until(lambda: (r := client.get("/readyz").json())["path"] == "index" and r)
        assert back["index"]["synced"] is True and back["safe_connect"] == {"flag": False}
        again = client.get("/v2.1/servers?all_tenants=1&limit=5", headers=ADMIN)
        assert again.headers[PATH] == "index"
        assert again.json() == listing.json()
        metrics = client.get("/metrics").text
        assert 'cellsight_api_index_probes_total{result="unavailable"}' in metrics
        assert 'cellsight_api_index_probes_total{result="synced"}' in metrics
        assert 'cellsight_api_path_decisions_total{path="index"' in metrics, metrics
        assert "cellsight_api_safe_connect_active 0.0" in metrics
        assert 'cellsight_api_request_seconds_count{path="index"} 1.0' in metrics
        assert 'cellsight_api_request_seconds_count{path="none"}' in metrics  # /readyz


@pytest.mark.parametrize("state", ["missing", "corrupt"])
def test_starts_whatever_the_embedded_file(sqlite_world: World, tmp_path: Path, state: str) -> None:
    settings = api_settings(tmp_path, **FAST)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if state == "corrupt":
        settings.index_path.write_bytes(b"not a database " * 500)
    with TestClient(create_app(settings, registry=sqlite_world.registry)) as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=5", headers=ADMIN)
        assert listing.status_code == 200 and listing.headers[PATH] == "fanout"
        ready = until(
            lambda: (
                (r := client.get("/readyz").json())["index"]["probe"]["last_result"]
                != "not probed yet"
                and r
            )
        )
        assert ready["status"] == "ready" and ready["path"] == "fanout"
        result = ready["index"]["probe"]["last_result"]
        assert result.startswith("unavailable" if state == "corrupt" else "unsynced"), result


def test_not_ready_only_when_neither_path_can_serve(tmp_path: Path) -> None:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    cell_db = tmp_path / "cell1.db"
    registry.add_cell("cell1", f"sqlite:///{cell_db}")
    app = create_app(api_settings(tmp_path, **FAST), registry=registry)
    clock = ManualClock(0.0)
    app.state.cell_states = CellStates(clock=clock)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        registry.engines.dispose()
        app.state.fanout.engines.dispose()
        for leftover in tmp_path.glob("cell1.db-*"):
            leftover.unlink()
        cell_db.write_bytes(b"garbage " * 2000)  # the only cell now cannot answer
        # Within READY_TTL the cells' last read answers: /readyz takes no token, and a
        # read of every cell per request let anyone load them (a probe).
        assert client.get("/readyz").status_code == 200
        clock.now = READY_TTL
        response = client.get("/readyz")
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["path"] == "none" and body["cells"][0]["state"] == "error"
        assert client.get("/healthz").status_code == 200
    registry.close()


def test_what_routes_open_on_first_use_is_closed_when_the_app_shuts_down(
    tmp_path: Path,
) -> None:
    """The reservations' notifier (and the bus client under it) is entered on
    ``app.state.resources``; the lifespan closes that stack at shutdown, where it had
    been left for the bus library's exit hook."""
    app = create_app(api_settings(tmp_path))
    closed: list[str] = []
    with TestClient(app):
        app.state.resources.callback(closed.append, "notifier")
        assert closed == []
    assert closed == ["notifier"]


@pytest.mark.parametrize(
    "path",
    [
        "/v2.1/servers?marker=00000000-0000-0000-0000-000000000001",
        "/v2.1/servers/00000000-0000-0000-0000-000000000001",
        "/v2.1/servers/detail",
    ],
)
def test_an_api_database_that_cannot_answer_is_a_503_on_every_path(
    tmp_path: Path, path: str
) -> None:
    """An API database without its tables (the API started before ``cells init``), as
    any error it raises: a 503 naming it, without SQL. The marker and the single server
    had answered 500."""
    with TestClient(create_app(api_settings(tmp_path))) as client:
        response = client.get(path, headers=ADMIN)
    assert response.status_code == 503, response.text
    message = response.json()["serviceUnavailable"]["message"]
    assert message.startswith("The API database is unavailable")
    assert "instance_mappings" not in response.text and "SELECT" not in response.text


def test_a_cell_that_lost_a_column_is_not_up(tmp_path: Path) -> None:
    """A database-fault probe: a cell whose ``instances`` lost a column was ``up`` on
    ``/readyz`` while every listing skipped it."""
    world = build_world(tmp_path / "world", "sqlite")
    try:
        first, second, *_ = world.registry.list_cells()
        engine = world.registry.cell_engine(first)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE instances DROP COLUMN display_description")
        with TestClient(create_app(api_settings(tmp_path), registry=world.registry)) as client:
            body = client.get("/readyz").json()
            listed = client.get("/v2.1/servers?all_tenants=1&limit=5", headers=ADMIN)
        cells = {c["uuid"]: c["state"] for c in body["cells"]}
        assert cells[first.uuid] == "error" and cells[second.uuid] == "up", cells
        assert body["status"] == "ready"  # the other cells serve
        assert listed.status_code == 200 and listed.headers[PATH] == "fanout"
        assert first.uuid in listed.headers[SKIPPED_CELLS]  # the listing skips the same cell
    finally:
        world.close()


def test_readiness_names_a_disabled_cell_which_still_serves(tmp_path: Path) -> None:
    world = build_world(tmp_path / "world", "sqlite")
    try:
        (first, *rest) = world.registry.list_cells()
        world.registry.set_disabled(first.uuid, True)
        with TestClient(create_app(api_settings(tmp_path), registry=world.registry)) as client:
            body = client.get("/readyz").json()
            listed = client.get("/v2.1/servers?all_tenants=1&limit=1000", headers=ADMIN)
        cells = {c["uuid"]: c for c in body["cells"]}
        assert cells[first.uuid]["disabled"] is True and cells[first.uuid]["state"] == "up"
        assert all(cells[c.uuid]["disabled"] is False for c in rest)
        cell_of = dict(world.registry.cells_of([s["id"] for s in listed.json()["servers"]]))
        assert first.uuid in cell_of.values()  # its servers are listed as before
    finally:
        world.close()
