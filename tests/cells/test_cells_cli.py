"""``cellsight cells …`` and ``cellsight ops …`` on the embedded defaults (SQLite, embedded bus)."""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from cellsight.cells.database import connect
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import iter_instances
from cellsight.cells.schema import create_cell_schema
from cellsight.cli import app
from cellsight.cli.groups import register
from cellsight.settings import load_settings
from tests.support.services import DatabaseFactory

Invoke = Callable[..., Result]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def cli(tmp_path: Path) -> Invoke:
    if not any(group.name == "cells" for group in app.registered_groups):
        register(app)
    runner = CliRunner()
    data_dir = tmp_path / "data"

    def invoke(*args: str | Path) -> Result:
        return runner.invoke(app, ["--data-dir", str(data_dir), *map(str, args)])

    return invoke


def test_add_list_and_named_errors(cli: Invoke, tmp_path: Path) -> None:
    result = cli("cells", "add", "--name", "east", "--db-url", f"sqlite:///{tmp_path / 'east.db'}")
    assert result.exit_code == 0, result.output
    assert "added cell east" in result.output
    listed = cli("cells", "list", "--counts")
    assert listed.exit_code == 0 and "east" in listed.output

    bad = cli("cells", "add", "--name", "x", "--db-url", "oracle://scott:tiger@db/orcl")
    assert bad.exit_code == 2
    assert "unsupported database 'oracle'" in one_line(bad.output)
    assert "tiger" not in bad.output
    twice = cli("cells", "add", "--name", "east", "--db-url", f"sqlite:///{tmp_path / 'e2.db'}")
    assert twice.exit_code == 2 and "name 'east' is already registered" in one_line(twice.output)
    # One database, two cells: each of its instances listed twice (Nova's create_cell
    # refuses a database connection another cell has).
    same = cli("cells", "add", "--name", "west", "--db-url", f"sqlite:///{tmp_path / 'east.db'}")
    assert same.exit_code == 2
    assert f"database 'sqlite+pysqlite:///{tmp_path / 'east.db'}' is already" in one_line(
        same.output
    )
    seeded = cli(
        "cells", "seed", "--instances", "1", "--db-url", f"sqlite:///{tmp_path / 'east.db'}"
    )
    assert seeded.exit_code == 2 and "is already registered" in one_line(seeded.output)
    listing = cli("cells", "list").output
    assert "west" not in listing and "east" in listing
    assert (tmp_path / "east.db").is_file()  # the failed seed left the cell's file be
    # A cell is named by its name or its uuid: neither may be another cell's other one
    # (a cell named with east's uuid was taken, and "cells disable UUID" disabled east).
    registry = CellRegistry.from_settings(load_settings(data_dir=tmp_path / "data"))
    east = registry.get_cell("east")
    registry.close()
    for args, said in (
        (("--name", east.uuid.upper()), east.uuid.upper()),
        (("--name", "x", "--uuid", east.uuid), east.uuid),
    ):
        taken = cli("cells", "add", *args, "--db-url", f"sqlite:///{tmp_path / 'n.db'}")
        assert taken.exit_code == 2, taken.output
        assert f"uuid '{said}' is already registered" in one_line(taken.output)
    named = "0B3E7C4C-0000-4000-8000-0000000000E2"  # a uuid no cell has (yet), any case
    as_name = cli("cells", "add", "--name", named, "--db-url", f"sqlite:///{tmp_path / 'n.db'}")
    assert as_name.exit_code == 0, as_name.output
    taken = cli("cells", "add", "--name", "y", "--uuid", named.lower(),
                "--db-url", f"sqlite:///{tmp_path / 'n2.db'}")  # fmt: skip
    assert taken.exit_code == 2, taken.output
    assert f"name '{named.lower()}' is already registered" in one_line(taken.output)
    disabled = cli("cells", "disable", named)  # the name still reaches its own cell
    assert disabled.exit_code == 0 and f"disabled cell {named} " in disabled.output
    assert cli("cells", "remove", named, "--skip-database-check").exit_code == 0
    unknown = cli("cells", "add-host", "--cell", "west", "--host", "h1")
    assert unknown.exit_code == 2
    assert "unknown cell 'west' (known cells: east)" in one_line(unknown.output)
    # A huge name is shown by its start and its length, not whole.
    huge = cli("cells", "add-host", "--cell", "w" * 100_000, "--host", "h1")
    assert huge.exit_code == 2
    shown = one_line(huge.output)
    assert f"unknown cell '{'w' * 80}…' (100000 characters)" in shown
    assert len(shown) < 400


def test_seed_reports_rate_and_fills_cells(cli: Invoke, tmp_path: Path) -> None:
    result = cli("cells", "seed", "--cells", "2", "--instances", "300", "--seed", "5")
    assert result.exit_code == 0, result.output
    text = one_line(result.output)
    assert "seeded 2 cells (cell1, cell2): 600 instances" in text
    assert re.search(r"\([\d,]+ rows/s\)", text)
    listed = one_line(cli("cells", "list", "--counts").output)
    assert listed.count(" 300 ") == 2

    settings = load_settings(data_dir=tmp_path / "data")
    registry = CellRegistry.from_settings(settings)
    try:
        cell = registry.get_cell("cell1")
        with connect(registry.cell_engine(cell)) as conn:
            uuid = next(iter_instances(conn, batch_size=1))["uuid"]
    finally:
        registry.close()
    shown = cli("ops", "show", uuid)
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)["nova_object.data"]
    assert (data["uuid"], data["cell_uuid"]) == (uuid, cell.uuid)
    assert data["revision"] >= 1


def test_seed_notify_with_the_bus_down_keeps_every_notification(
    cli: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLSIGHT_BUS_URL", "amqp://guest:guest@127.0.0.1:1//")  # refused
    down = cli("cells", "seed", "--instances", "30", "--chunk-size", "10", "--notify")
    assert down.exit_code == 0, down.output
    text = one_line(down.output)
    assert "30 instances" in text and "0 notifications (30 more wait in the cells' outboxes" in text
    monkeypatch.delenv("CELLSIGHT_BUS_URL")  # the embedded bus, which answers
    relayed = cli("outbox", "relay")
    assert relayed.exit_code == 0, relayed.output
    assert "cell1: published 30, 0 left" in one_line(relayed.output)


def test_ops_on_the_embedded_bus(cli: Invoke, tmp_path: Path) -> None:
    assert (
        cli("cells", "add", "--name", "c1", "--db-url", f"sqlite:///{tmp_path / 'c1.db'}").exit_code
        == 0
    )
    for host in ("h1", "h2"):
        assert cli("cells", "add-host", "--cell", "c1", "--host", host).exit_code == 0
    booted = cli(
        "ops", "boot", "--name", "web", "--flavor", "m1.small", "--project", "p1", "--user", "u1"
    )
    assert booted.exit_code == 0, booted.output
    match = UUID.search(booted.output)
    assert match is not None
    uuid = match.group(0)
    assert "alternates: h" in booted.output
    stopped = cli("ops", "stop", uuid)
    assert stopped.exit_code == 0 and "state=stopped" in stopped.output
    again = cli("ops", "stop", uuid)
    # refused by the instance's state: a runtime failure (exit 1), not a usage error
    assert again.exit_code == 1 and "cannot power off" in one_line(again.output)
    deleted = cli("ops", "delete", uuid)
    assert deleted.exit_code == 0 and "state=deleted" in deleted.output
    flavor = cli(
        "ops", "boot", "--name", "x", "--flavor", "m9.huge", "--project", "p", "--user", "u"
    )
    assert flavor.exit_code == 2 and "unknown flavor 'm9.huge'" in one_line(flavor.output)
    missing = cli("ops", "stop", "00000000-0000-4000-8000-000000000000")
    assert missing.exit_code == 2 and "not found" in missing.output


def test_add_host_announces_the_node(cli: Invoke, tmp_path: Path) -> None:
    """``cells add-host`` emits the node's ``compute_node.update`` (through the outbox),
    so the node index and the API's node state cache hear of it without a sync."""
    from cellsight.clients import bus_connection
    from cellsight.notifications.queues import indexer_queue

    settings = load_settings(data_dir=tmp_path / "data")
    db = f"sqlite:///{tmp_path / 'c1.db'}"
    assert cli("cells", "add", "--name", "c1", "--db-url", db).exit_code == 0
    with bus_connection(settings) as connection:
        queue = indexer_queue(settings.indexer_queue, settings.exchange)(connection)
        queue.declare()  # as the indexer has
        added = cli("cells", "add-host", "--cell", "c1", "--host", "h9", "--vcpus", "8")
        assert added.exit_code == 0, added.output
        message = queue.get(no_ack=True)
        assert message is not None
        body = json.loads(json.loads(message.body)["oslo.message"])
        assert body["event_type"] == "compute_node.update"
        data = body["payload"]["nova_object.data"]
        assert (data["host"], data["vcpus"]) == ("h9", 8)
        assert UUID.search(added.output).group(0) == data["uuid"]  # type: ignore[union-attr]
        # An operator probe found no command to take a host out of scheduling.
        disabled = cli("cells", "set-host", "--cell", "c1", "--host", "h9", "--disable")
        assert disabled.exit_code == 0, disabled.output
        assert "disabled=True offline=False" in one_line(disabled.output)
        offline = cli("cells", "set-host", "--cell", "c1", "--host", "h9", "--offline")
        assert "disabled=True offline=True" in one_line(offline.output)
        updates = [queue.get(no_ack=True) for _ in range(2)]
        states = [
            json.loads(json.loads(m.body)["oslo.message"])["payload"]["nova_object.data"]
            for m in updates
            if m is not None
        ]
        assert [(d["disabled"], d["offline"], d["revision"]) for d in states] == [
            (True, False, data["revision"] + 1),
            (True, True, data["revision"] + 2),
        ]
    # Its only host disabled, the cell takes no new instance.
    placed = cli("ops", "boot", "--name", "w", "--flavor", "m1.tiny", "--project", "p",
                 "--user", "u", "--cell", "c1")  # fmt: skip
    assert placed.exit_code == 1, placed.output
    assert cli("cells", "set-host", "--cell", "c1", "--host", "h9").exit_code == 2
    unknown = cli("cells", "set-host", "--cell", "c1", "--host", "nope", "--enable")
    # A name the operator gave that is unknown: usage (2), as an unknown cell or flavor
    # is and as a duplicate host is (a README probe: it was 1).
    assert unknown.exit_code == 2 and "no compute node 'nope' in cell c1" in one_line(
        unknown.output
    )


@pytest.mark.services
def test_a_cell_whose_database_refuses_a_write_is_not_left_registered(
    cli: Invoke, make_database: DatabaseFactory
) -> None:
    """An operator probe: a PostgreSQL user with SELECT grants only got an error from
    `cells add` (Cellsight writes its own tables in a cell), and the cell stayed listed,
    its name taken, and synced from."""
    url = sa.make_url(make_database("postgresql"))
    engine = sa.create_engine(url)
    create_cell_schema(engine)
    role = f"cs_ro_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        reader = url.set(username=role).render_as_string(hide_password=False)
        refused = cli("cells", "add", "--name", "ro", "--db-url", reader)
        assert refused.exit_code == 1, refused.output
        assert "permission denied" in one_line(refused.output), refused.output
        listed = cli("cells", "list")
        assert listed.exit_code == 0 and "ro" not in listed.output.split(), listed.output
        writer = url.render_as_string(hide_password=False)
        added = cli("cells", "add", "--name", "ro", "--db-url", writer)
        assert added.exit_code == 0, added.output  # the name was not left taken
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")
        engine.dispose()


@pytest.mark.parametrize(
    ("module", "url"),
    [("psycopg", "postgresql://u:secret@127.0.0.1/c1"), ("pymysql", "mysql://root@127.0.0.1/c1")],
)
def test_a_missing_driver_names_the_extra_that_installs_it(
    cli: Invoke, monkeypatch: pytest.MonkeyPatch, module: str, url: str
) -> None:
    """A README probe: the base install has no PostgreSQL or MariaDB driver, and the
    error did not say where one comes from."""
    monkeypatch.setitem(sys.modules, module, None)  # as if never installed
    result = cli("cells", "add", "--name", "pg", "--db-url", url)
    line = one_line(result.output)
    assert result.exit_code == 2 and "its driver is not installed" in line
    assert "pip install 'cellsight[production]'" in line and "secret" not in line
