"""A cell database that stops answering without closing its connections (a frozen host
or process, a proxy that stops forwarding) fails the command that reads it after
``db_statement_timeout`` (and the connect timeout), naming the cell; the other cells
are served and the maintenance lock is released.

Found from outside (a database-fault probe): ``index status`` and ``outbox relay`` hung
on a MariaDB cell frozen before its handshake (PyMySQL's connect timeout does not cover
it), ``index sync`` and ``index verify --repair`` on a cell of either dialect frozen once
connected (psycopg waits for an answer with no bound at all), and a verify held so kept
its maintenance lock.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cli.test_cli_errors import cellsight
from tests.support.cli_cells import OWNER, assert_lock_free, synced_beside_lite
from tests.support.proxy import Proxy
from tests.support.services import create_database, drop_database, server_fixture

pytestmark = pytest.mark.services
BOUNDS = {"CELLSIGHT_DB_STATEMENT_TIMEOUT": "1", "CELLSIGHT_DB_CONNECT_TIMEOUT": "2"}
# The slowest a command may be here: the connect and statement bounds a few times over
# (a retried connect, a ping, the pool's reset), far below "for ever".
PROMPT = 30.0


@pytest.fixture(params=["postgresql", "mariadb"])
def frozen_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Proxy]]:
    """Cells ``far`` (its database behind a proxy) and ``lite`` (one instance), synced."""
    server: sa.URL = request.getfixturevalue(server_fixture(request.param))
    name, url = create_database(server)
    proxy = Proxy((server.host or "127.0.0.1", server.port or 0))
    proxy.start()
    far = sa.make_url(url).set(host="127.0.0.1", port=proxy.port)
    data = tmp_path / "data"
    lite = f"sqlite:///{tmp_path / 'lite.db'}"
    try:
        synced_beside_lite(data, "far", far.render_as_string(False), lite)
        yield data, proxy
    finally:
        proxy.stop()
        drop_database(server, name)


def _timed(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = cellsight(data, *args, env=BOUNDS)
    took = time.monotonic() - started
    assert took < PROMPT, (args, took, done.stderr)
    return done


def test_status_and_relay_name_a_cell_frozen_before_it_answers(
    frozen_world: tuple[Path, Proxy],
) -> None:
    data, proxy = frozen_world
    proxy.freeze()
    status = _timed(data, "index", "status", "--json")
    assert status.returncode == 0, status.stderr
    for resource in json.loads(status.stdout):
        cells = {c["name"]: c for c in resource["cells"]}
        assert cells["far"]["rows"] is None, cells
        assert "is unavailable" in cells["far"]["error"], cells
        assert cells["lite"]["rows"] == 1, cells  # (no node index: its documents are None)
    relay = _timed(data, "outbox", "relay")
    assert relay.returncode == 1, relay.stderr
    lines = relay.stdout.splitlines()
    assert any(line.startswith("far: published 0") and "is unavailable" in line for line in lines)
    assert "lite: published 0, 0 left" in lines, relay.stdout
    assert relay.stderr.strip().splitlines()[-1] == "error: outbox relay incomplete for far"


def test_sync_and_verify_name_a_cell_that_stops_answering_once_connected(
    frozen_world: tuple[Path, Proxy],
) -> None:
    data, proxy = frozen_world
    proxy.freeze_on(b"FROM instances")
    verify = _timed(data, "index", "verify", "--repair", "--json")
    assert verify.returncode == 1, verify.stderr
    (report,) = [r for r in json.loads(verify.stdout)["reports"] if r["resource"] == "instance"]
    cells = {c["name"]: c for c in report["cells"]}
    assert "is unavailable" in cells["far"]["failed"], cells["far"]
    assert cells["lite"]["failed"] is None and cells["lite"]["rows"] == 1, cells["lite"]
    assert_lock_free(data)

    proxy.thaw()
    proxy.freeze_on(b"FROM instances")
    sync = _timed(data, "index", "sync")
    assert sync.returncode == 1
    last = sync.stderr.strip().splitlines()[-1]
    assert "cell far is unreadable" in last and "is unavailable" in last, sync.stderr
    assert_lock_free(data)

    proxy.thaw()  # and once it answers again, everything does
    again = cellsight(data, "index", "verify", "--json")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_connection_dropped_between_pages_is_read_again(
    frozen_world: tuple[Path, Proxy],
) -> None:
    """Found by the same probe: a connection the server dropped between two pages (a
    failover, ``pg_terminate_backend``, MariaDB ``KILL``) failed the whole sync. (Verify
    pages its rows the same way, 10,000 at a time.)"""
    data, proxy = frozen_world
    done = cellsight(data, "cells", "add-host", "--cell", "far", "--host", "h2")
    assert done.returncode == 0, done.stderr
    for i in range(5):
        boot = ("ops", "boot", "--cell", "far", "--name", f"vm{i}", "--flavor", "m1.small")
        done = cellsight(data, *boot, *OWNER)
        assert done.returncode == 0, done.stderr
    # The second page of instances (keyset: "after the last uuid") is the one cut.
    proxy.cut_on(b"instances.uuid >")
    run = cellsight(data, "index", "sync", "--batch-size", "2", env=BOUNDS)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "dropped the connection" in run.stderr and "reading the page again" in run.stderr
    verify = cellsight(data, "index", "verify", "--type", "instance", "--json")
    assert verify.returncode == 0, verify.stdout
    (report,) = [r for r in json.loads(verify.stdout)["reports"] if r["resource"] == "instance"]
    assert {c["name"]: c["rows"] for c in report["cells"]} == {"far": 5, "lite": 1}
