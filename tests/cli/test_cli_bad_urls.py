"""Found from outside: a URL whose host or port does not parse (an unclosed IPv6
bracket, a port past 65535 or not a number, a heartbeat that is no number) failed deep
inside as ``internal error: ValueError`` with exit 1, for the bus, the search engine and
the API database; and a registered cell whose stored URL was edited into one ended
every command that reads the cells (and made the API's listing a 500), where an
unreachable cell is skipped and named. A bad setting is now a usage error naming it
(the password masked); such a cell is down, as an unreachable one is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.headers import SKIPPED_CELLS
from cellsight.cli.errors import USAGE
from tests.cli.test_cli_errors import SECRET, assert_one_line_error, cellsight
from tests.support.api_world import ADMIN, api_settings, build_world

RABBIT = f"amqp://guest:{SECRET}@127.0.0.1"
BROKEN = "postgresql://postgres@[::1/x"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (f"{RABBIT}:99999//", "Port out of range"),
        ("amqp://[::1", "Invalid IPv6 URL"),
        (f"{RABBIT}:abc//", "Port could not be cast"),
        (f"{RABBIT}:5672//?heartbeat=abc", "heartbeat 'abc' is not a number of seconds"),
        (f"{RABBIT}:5672//?heartbeat=-1", "heartbeat '-1' is not a number of seconds"),
        (f"{RABBIT}:5672//?heartbeat=nan", "heartbeat 'nan' is not a number of seconds"),
    ],
)
def test_a_bus_url_that_does_not_parse_is_a_usage_error(tmp_path: Path, url: str, why: str) -> None:
    result = cellsight(tmp_path / "d", "dlq", "list", env={"CELLSIGHT_BUS_URL": url})
    assert_one_line_error(result, USAGE, "bus URL", why)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        (f"http://elastic:{SECRET}@[::1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:abc", "Port could not be cast"),
    ],
)
def test_a_search_url_that_does_not_parse_is_a_usage_error(
    tmp_path: Path, url: str, why: str
) -> None:
    result = cellsight(tmp_path / "d", "index", "status", env={"CELLSIGHT_SEARCH_URL": url})
    assert_one_line_error(result, USAGE, "search engine URL", why)


@pytest.mark.parametrize("url", [BROKEN, "postgresql://postgres@127.0.0.1:abc/x"])
def test_an_api_database_url_with_a_bad_port_is_a_usage_error(tmp_path: Path, url: str) -> None:
    result = cellsight(tmp_path / "d", "cells", "list", env={"CELLSIGHT_API_DB_URL": url})
    assert_one_line_error(result, USAGE, "database URL", "not a URL of the form")
    add = cellsight(tmp_path / "d", "cells", "add", "--name", "c", "--db-url", url)
    assert_one_line_error(add, USAGE, "database URL", "not a URL of the form")


@pytest.fixture(scope="module")
def one_cell_broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("broken") / "data"
    seed = cellsight(data, "cells", "seed", "--cells", "2", "--instances", "10")
    assert seed.returncode == 0, seed.stderr
    with sqlite3.connect(data / "api.db") as conn:
        conn.execute(
            "UPDATE cell_mappings SET database_connection = ? WHERE name = 'cell1'", (BROKEN,)
        )
    return data


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["query", "instance", "uuid"], "cells that did not answer"),
        (["query", "node", "name"], "cells that did not answer"),
        (["nodes", "refresh"], "cells that did not answer: cell1"),
        (["outbox", "status"], "cell1: unavailable"),
        (
            ["ops", "boot", "--name", "m", "--flavor", "m1.tiny", "--project", "p", "--user", "u"],
            "",
        ),
    ],
)
def test_a_cell_with_an_unusable_stored_url_is_skipped_and_named(
    one_cell_broken: Path, command: list[str], said: str
) -> None:
    result = cellsight(one_cell_broken, *command)
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr
    assert said in result.stdout + result.stderr
    if command[0] == "query":
        assert "cell1;uuid=" in result.stdout + result.stderr


def test_the_api_lists_the_other_cells_and_names_the_broken_one(tmp_path: Path) -> None:
    world = build_world(tmp_path / "w", "sqlite")
    broken = world.registry.list_cells()[0]
    with world.registry.api_engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE cell_mappings SET database_connection = ? WHERE uuid = ?",
            (BROKEN, broken.uuid),
        )
    app = create_app(api_settings(tmp_path), registry=world.registry)
    with TestClient(app) as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=1000", headers=ADMIN)
    assert listing.status_code == 200, listing.text
    assert f"uuid={broken.uuid};reason=error" in listing.headers[SKIPPED_CELLS]
    assert listing.json()["servers"]
    world.close()
