"""Found from outside: a URL whose host or port does not parse (an unclosed IPv6
bracket, a port past 65535 or not a number, a heartbeat that is no number) failed deep
inside as ``internal error: ValueError`` with exit 1, for the bus, the search engine and
the API database; and a registered cell whose stored URL was edited into one ended
every command that reads the cells (and made the API's listing a 500), where an
unreachable cell is skipped and named. A bad setting is now a usage error naming the
setting (CELLSIGHT_BUS_URL, CELLSIGHT_SEARCH_URL, CELLSIGHT_API_DB_URL) or the option
(--db-url), the URL as given with its password masked, and what urllib says is wrong
with its host or port (a database port past 65535 was taken, and refused by the driver
as if the server were down); such a cell is down, as an unreachable one is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.headers import SKIPPED_CELLS
from cellsight.cli.errors import RUNTIME, USAGE
from cellsight.clients import BadBusURL, check_bus_url
from tests.cli.test_cli_errors import SECRET, assert_one_line_error, cellsight, closed_port
from tests.support.api_world import ADMIN, api_settings, build_world

RABBIT = f"amqp://guest:{SECRET}@127.0.0.1"
BROKEN = "postgresql://postgres@[::1/x"
BOOT = ["ops", "boot", "--name", "m", "--flavor", "m1.tiny", "--project", "p", "--user", "u"]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (f"{RABBIT}:99999//", "Port out of range"),
        ("amqp://[::1", "Invalid IPv6 URL"),
        (f"amqp://guest:{SECRET}@[::1", "Invalid IPv6 URL"),
        (f"{RABBIT}:abc//", "Port could not be cast"),
        (f"{RABBIT}:5672//?heartbeat=abc", "heartbeat 'abc' is not a number of seconds"),
        (f"{RABBIT}:5672//?heartbeat=-1", "heartbeat '-1' is not a number of seconds"),
        (f"{RABBIT}:5672//?heartbeat=nan", "heartbeat 'nan' is not a number of seconds"),
    ],
)
def test_a_bus_url_that_does_not_parse_is_a_usage_error(tmp_path: Path, url: str, why: str) -> None:
    result = cellsight(tmp_path / "d", "dlq", "list", env={"CELLSIGHT_BUS_URL": url})
    assert_one_line_error(result, USAGE, "CELLSIGHT_BUS_URL", "bus URL", why)


@pytest.mark.parametrize(
    "command",
    [BOOT, ["outbox", "relay"], ["indexer"], ["cells", "list"]],
)
def test_every_command_names_the_bad_bus_setting(tmp_path: Path, command: list[str]) -> None:
    # Refused where the settings are read, before any command opens anything.
    env = {"CELLSIGHT_BUS_URL": f"{RABBIT}:99999//"}
    result = cellsight(tmp_path / "d", *command, env=env)
    assert_one_line_error(result, USAGE, "CELLSIGHT_BUS_URL", "Port out of range")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        (f"http://elastic:{SECRET}@[::1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:abc", "Port could not be cast"),
        (f"http://elastic:{SECRET}@127.0.0.1:abc", "Port could not be cast"),
    ],
)
def test_a_search_url_that_does_not_parse_is_a_usage_error(
    tmp_path: Path, url: str, why: str
) -> None:
    result = cellsight(tmp_path / "d", "index", "status", env={"CELLSIGHT_SEARCH_URL": url})
    assert_one_line_error(result, USAGE, "CELLSIGHT_SEARCH_URL", "search engine URL", why)


DATABASE_URLS = [
    (BROKEN, "Invalid IPv6 URL"),
    (f"postgresql://postgres:{SECRET}@[::1/x", "Invalid IPv6 URL"),
    ("postgresql://postgres@127.0.0.1:abc/x", "Port could not be cast"),
    (f"postgresql://postgres:{SECRET}@127.0.0.1:abc/x", "Port could not be cast"),
    ("mysql+pymysql://root@127.0.0.1:abc/x", "Port could not be cast"),
    # SQLAlchemy reads a password up to the first "@", "/" and ":" in it too (urllib
    # would take its start for the host): never shown.
    (f"postgresql://postgres:{SECRET}/:x@127.0.0.1:5x/x", "Port could not be cast"),
    # SQLAlchemy takes any integer: the driver refused it later, as an unreachable server.
    ("postgresql://postgres@127.0.0.1:99999/x", "Port out of range"),
    ("mysql+pymysql://root@127.0.0.1:99999/x", "Port out of range"),
]


@pytest.mark.parametrize(("url", "why"), DATABASE_URLS)
def test_an_api_database_url_with_a_bad_host_or_port_is_a_usage_error(
    tmp_path: Path, url: str, why: str
) -> None:
    result = cellsight(tmp_path / "d", "cells", "list", env={"CELLSIGHT_API_DB_URL": url})
    # The URL as given (its scheme too), the password masked.
    scheme = url.partition("://")[0]
    err = assert_one_line_error(result, USAGE, "CELLSIGHT_API_DB_URL", f"'{scheme}://", why)
    assert "not a URL of the form" not in err


@pytest.mark.parametrize(("url", "why"), DATABASE_URLS)
def test_cells_add_names_a_db_url_with_a_bad_host_or_port(
    tmp_path: Path, url: str, why: str
) -> None:
    add = cellsight(tmp_path / "d", "cells", "add", "--name", "newc", "--db-url", url)
    assert_one_line_error(add, USAGE, "--db-url", f"'{url.partition('://')[0]}://", why)


# A stored URL its driver refuses at connect time: a certificate file gone, say.
DRIVER_REFUSES = "mysql+pymysql://root@127.0.0.1:3306/x?ssl_ca=/nonexistent/ca.pem"


@pytest.fixture(
    scope="module",
    params=[BROKEN, "foo", DRIVER_REFUSES],
    ids=["bad-port", "not-a-url", "driver-refuses"],
)
def one_cell_broken(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    data = tmp_path_factory.mktemp("broken") / "data"
    seed = cellsight(data, "cells", "seed", "--cells", "2", "--instances", "10")
    assert seed.returncode == 0, seed.stderr
    with sqlite3.connect(data / "api.db") as conn:
        conn.execute(
            "UPDATE cell_mappings SET database_connection = ? WHERE name = 'cell1'",
            (request.param,),
        )
    return data


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["query", "instance", "uuid"], "cells that did not answer"),
        (["query", "node", "name"], "cells that did not answer"),
        (["nodes", "refresh"], "cells that did not answer: cell1"),
        (["outbox", "status"], "cell1: unavailable"),
        (["cells", "list", "--counts"], "unavailable"),
        (BOOT, "skipping cell cell1"),
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


@pytest.mark.parametrize(
    "command", [["outbox", "relay"], ["cells", "add-host", "--cell", "cell1", "--host", "h1"]]
)
def test_what_needs_the_broken_cell_fails_naming_it(
    one_cell_broken: Path, command: list[str]
) -> None:
    # As with an unreachable cell: a runtime failure (exit 1) that names the cell.
    result = cellsight(one_cell_broken, *command)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "internal error" not in result.stderr
    assert "cell1" in result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize(
    "url",
    [
        BROKEN,
        "foo",
        "postgresql://postgres@127.0.0.1:99999/x",
        DRIVER_REFUSES,  # a 500 when the driver's refusal was a usage error everywhere
        "mysql+pymysql://root@127.0.0.1:3306/x?bogus=1",
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres?bogus=1",
    ],
)
def test_the_api_lists_the_other_cells_and_names_the_broken_one(tmp_path: Path, url: str) -> None:
    world = build_world(tmp_path / "w", "sqlite")
    broken = world.registry.list_cells()[0]
    with world.registry.api_engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE cell_mappings SET database_connection = ? WHERE uuid = ?",
            (url, broken.uuid),
        )
    app = create_app(api_settings(tmp_path), registry=world.registry)
    with TestClient(app) as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=1000", headers=ADMIN)
    assert listing.status_code == 200, listing.text
    assert f"uuid={broken.uuid};reason=error" in listing.headers[SKIPPED_CELLS]
    assert listing.json()["servers"]
    world.close()


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@h1:5672;amqp://guest:guest@h2:5672",  # kombu's failover list
        "sentinel://h1:26379;sentinel://h2:26379",
        "amqps://u:p@[::1]:5671//?ssl=1&heartbeat=30",
        "redis://localhost",
        "redis+socket:///tmp/redis.sock",
        "pyamqp://guest@localhost//",
    ],
)
def test_the_bus_urls_kombu_reads_pass_the_check(url: str) -> None:
    """A review found the first check refused failover lists (``urlsplit`` read the
    whole list as one URL, its port "5672;amqp:")."""
    check_bus_url(url)


@pytest.mark.parametrize("url", ["memory://", "filesystem://", "sqs://", "qpid://h:5672"])
def test_a_kombu_transport_cellsight_does_not_use_is_refused(tmp_path: Path, url: str) -> None:
    """memory:// was taken: ``outbox relay`` published a cell's waiting notifications
    into its own process, reported them published and deleted them from the outbox
    (found by a probe); the indexer ran on, consuming nothing."""
    scheme = url.partition("://")[0]
    for command in (["outbox", "relay"], ["indexer"], ["dlq", "list"]):
        result = cellsight(tmp_path / "d", *command, env={"CELLSIGHT_BUS_URL": url})
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert "CELLSIGHT_BUS_URL" in last and f"{scheme!r}" in last, last
        assert "does not use" in last, last


@pytest.mark.parametrize(
    ("setting", "url"),
    [
        ("CELLSIGHT_BUS_URL", "amqp://h\udcff//"),
        ("CELLSIGHT_API_DB_URL", "postgresql://h\udcff/x"),
        ("CELLSIGHT_SEARCH_URL", "http://h\udcff:9200"),
    ],
)
def test_a_url_setting_that_is_not_utf8_is_a_usage_error(
    tmp_path: Path, setting: str, url: str
) -> None:
    """A byte that is not UTF-8 in the environment (here 0xff) reached the drivers,
    whose host encoding failed: "internal error: UnicodeError" (found on a reread)."""
    result = cellsight(tmp_path / "d", "cells", "list", env={setting: url})
    assert_one_line_error(result, USAGE, setting, "is not valid UTF-8")


def test_port_0_is_refused_not_read_as_the_default_port() -> None:
    """kombu read port 0 as 5672: a probe's `dlq list` ran against the real broker."""
    with pytest.raises(BadBusURL, match="port 0 is no port"):
        check_bus_url("amqp://guest:guest@127.0.0.1:0//")


def test_an_unreachable_bus_is_shown_as_it_was_set(tmp_path: Path) -> None:
    """kombu's as_uri wrote an IPv6 host as %3A%3A1 in the "unavailable" line."""
    url = f"amqp://guest:{SECRET}@[::1]:{closed_port()}//"
    result = cellsight(tmp_path / "d", "dlq", "list", env={"CELLSIGHT_BUS_URL": url})
    shown = url.replace(SECRET, "***")
    assert_one_line_error(result, RUNTIME, f"message bus {shown} is unavailable")


def test_each_url_of_a_failover_list_is_checked() -> None:
    with pytest.raises(BadBusURL, match="h2:abc"):
        check_bus_url("amqp://h1:5672;amqp://h2:abc")


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("bogus=1", "its driver refuses a query parameter"),
        ("connect_timeout=abc", "a query parameter does not parse"),
        ("ssl_ca=/nonexistent/ca.pem", "a file a query parameter names does not exist"),
    ],
)
def test_a_db_url_query_parameter_the_driver_refuses_is_a_usage_error(
    tmp_path: Path, query: str, why: str
) -> None:
    """An adversarial probe: these were "internal error: TypeError: ...", exit 1, or a bare
    "No such file or directory", naming neither the URL nor the parameter."""
    url = f"mysql+pymysql://root:hunter2@127.0.0.1:3306/cellsight_never?{query}"
    add = cellsight(tmp_path / "d", "cells", "add", "--name", "newc", "--db-url", url)
    err = assert_one_line_error(add, USAGE, "database URL 'mysql+pymysql://root:***@", why)
    assert "hunter2" not in err and "internal error" not in err


def test_a_postgresql_url_option_libpq_refuses_is_a_usage_error(tmp_path: Path) -> None:
    # It was "database ... is unavailable: invalid connection option", exit 1.
    url = "postgresql+psycopg://postgres:hunter2@127.0.0.1:5432/postgres?bogus=1"
    add = cellsight(tmp_path / "d", "cells", "add", "--name", "newc", "--db-url", url)
    err = assert_one_line_error(
        add, USAGE, "database URL 'postgresql+psycopg://postgres:***@", "its driver refuses",
        'invalid connection option "bogus"',
    )  # fmt: skip
    assert "hunter2" not in err
