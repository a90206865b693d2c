"""A non-ASCII value for ``uuid`` on every dialect, both paths (found from outside): on
MariaDB the uuid column is ascii, and comparing it with such a value was an error, so the
fan-out skipped the cell as failed (a listing's body right by accident) and query v2's
lookup dropped that cell's rows matching the filter's other branch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import register_node
from cellsight.cells.operations import Operations
from tests.support.api_world import ADMIN, World, make_client
from tests.support.publishers import CollectingPublisher
from tests.support.query2_world import make_pair
from tests.support.services import DatabaseFactory

WORLDS = ["sqlite_world", pytest.param("postgres_world", marks=pytest.mark.services)]
WORLDS.append(pytest.param("mariadb_world", marks=pytest.mark.services))


@pytest.fixture(params=WORLDS)
def pair(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    world: World = request.getfixturevalue(request.param)
    made = make_pair(tmp_path, world)
    yield made, world
    made.close()


@pytest.mark.parametrize("value", ["ÿ", "é", "\uff11\uff12", "abc\u00e9-0000"])
def test_a_non_ascii_uuid_matches_nothing_and_fails_no_cell(pair: Any, value: str) -> None:
    made, world = pair
    for client in (made.index, made.fanout):
        listed = client.get(
            "/v2.1/servers", params={"all_tenants": "1", "uuid": value}, headers=ADMIN
        )
        assert listed.status_code == 200, listed.text
        assert listed.json()["servers"] == []
        assert "x-cellsight-skipped-cells" not in listed.headers
    # The filter's other branch alone: what the disjunction must answer too.
    name = sorted(row["display_name"] for _, row in world.rows() if row["display_name"])[0]
    alone = {"fields": ["uuid"], "filter": ["==", "name", name]}
    either = {"fields": ["uuid"], "filter": ["|", ["==", "uuid", value], ["==", "name", name]]}
    for client in (made.index, made.fanout):
        expected = client.post("/v2.1/query/instance", json=alone, headers=ADMIN)
        assert expected.status_code == 200 and expected.json()["data"], expected.text
        answered = client.post("/v2.1/query/instance", json=either, headers=ADMIN)
        assert answered.status_code == 200, answered.text
        assert "x-cellsight-skipped-cells" not in answered.headers
        assert sorted(answered.json()["data"]) == sorted(expected.json()["data"])


@pytest.mark.services
def test_a_non_ascii_id_or_marker_on_a_mariadb_api_database_is_not_found(
    make_database: DatabaseFactory, tmp_path: Path
) -> None:
    """The API database's uuid columns are ascii on MariaDB too: a full-width id (which
    uuid.UUID reads) and a non-ASCII marker were 503s there; Nova answers 404 and 400."""
    registry = CellRegistry(make_database("mariadb"))
    registry.create_schema()
    try:
        registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
        ops = Operations(registry, CollectingPublisher(), publisher_id="t")
        register_node(ops, "cell1", "h1")
        ops.boot(BootRequest("web", "m1.small", "p1", "u1"))
        client = make_client(tmp_path / "api", World(registry, "mariadb"))
        shown = client.get("/v2.1/servers/" + "\uff11" * 32, headers=ADMIN)
        assert shown.status_code == 404, shown.text
        listed = client.get("/v2.1/servers", params={"marker": "é"}, headers=ADMIN)
        assert listed.status_code == 400 and "marker [é] not found" in listed.text
        assert client.get("/v2.1/servers", headers=ADMIN).status_code == 200
        client.close()
    finally:
        registry.close()
