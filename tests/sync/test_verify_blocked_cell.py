"""Found from outside: ``index verify`` took Ctrl-C (or SIGTERM) only once a cell's
query that another session's lock held up returned, 40 to 60 s later, and kept the
maintenance lock meanwhile (every sync and verify of the type: exit 3). The cells are
now read in daemon threads the interrupted command does not wait for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cli.errors import INTERRUPTED
from tests.cli.test_cli_errors import cellsight
from tests.support.cli_cells import assert_lock_free, synced_beside_lite
from tests.support.services import create_database, drop_database
from tests.support.waiting import wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def cell_database(postgres_server: sa.URL) -> Iterator[tuple[str, sa.Engine]]:
    name, url = create_database(postgres_server)
    admin = sa.create_engine(postgres_server)
    try:
        yield url, admin
    finally:
        admin.dispose()
        drop_database(postgres_server, name)


def test_an_interrupted_verify_does_not_wait_for_a_blocked_cell(
    tmp_path: Path, cell_database: tuple[str, sa.Engine]
) -> None:
    url, admin = cell_database
    data = tmp_path / "data"
    for args in (("cells", "add", "--name", "pg", "--db-url", url), ("index", "sync")):
        done = cellsight(data, *args)
        assert done.returncode == 0, done.stderr
    database = sa.make_url(url).database
    locker = sa.create_engine(url).connect()
    try:
        locker.exec_driver_sql("BEGIN")
        locker.exec_driver_sql("LOCK TABLE instances IN ACCESS EXCLUSIVE MODE")
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
        verify = subprocess.Popen(
            [sys.executable, "-m", "cellsight", "--data-dir", str(data), "index", "verify"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean,
        )

        def waiting_on_the_lock() -> bool:
            with admin.connect() as conn:
                query = sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = :db AND wait_event_type = 'Lock'"
                )
                return bool(conn.execute(query, {"db": database}).scalar_one())

        wait_for(waiting_on_the_lock, timeout=60, what="verify to wait on the locked table")
        verify.send_signal(signal.SIGINT)
        # The table stays locked until this test ends: the verify must not wait for it.
        _, err = verify.communicate(timeout=30)
        assert verify.returncode == INTERRUPTED, err
        assert err.strip().splitlines()[-1] == "error: interrupted", err
        assert_lock_free(data)  # released by the interrupted one
    finally:
        locker.close()


def test_verify_and_sync_give_up_on_a_locked_cell_and_name_it(
    tmp_path: Path, cell_database: tuple[str, sa.Engine]
) -> None:
    """Without an interrupt: a cell whose tables another session keeps locked is given
    up after the lock timeout and named, the other cells are verified, and the
    maintenance lock is released (they waited as long as the lock was held)."""
    url, _ = cell_database
    data = tmp_path / "data"
    synced_beside_lite(data, "pg", url, f"sqlite:///{tmp_path / 'lite.db'}")
    locker = sa.create_engine(url).connect()
    try:
        locker.exec_driver_sql("BEGIN")
        locker.exec_driver_sql("LOCK TABLE instances IN ACCESS EXCLUSIVE MODE")
        env = {"CELLSIGHT_DB_LOCK_TIMEOUT": "1"}
        verify = cellsight(data, "index", "verify", "--json", env=env)
        assert verify.returncode == 1, verify.stderr
        (report,) = [r for r in json.loads(verify.stdout)["reports"] if r["resource"] == "instance"]
        cells = {c["name"]: c for c in report["cells"]}
        assert "is busy" in cells["pg"]["failed"], cells["pg"]
        assert "CELLSIGHT_DB_LOCK_TIMEOUT" in cells["pg"]["failed"]
        assert cells["lite"]["failed"] is None and cells["lite"]["rows"] == 1, cells["lite"]
        sync = cellsight(data, "index", "sync", env=env)
        assert sync.returncode == 1
        last = sync.stderr.strip().splitlines()[-1]
        assert "cell pg" in last and "is busy" in last, sync.stderr
        assert_lock_free(data)
    finally:
        locker.close()
