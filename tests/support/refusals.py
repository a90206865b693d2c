"""Refusals as a full disk makes them, from the real server: a table that refuses deletes
(a trigger, written once per dialect), and a Redis server that cannot persist."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
import sqlalchemy as sa

MESSAGE = "disk full stand-in"


def refuse_deletes(engine: sa.Engine, table: str, dialect: str) -> None:
    name = f"refuse_{table}"
    statements = {
        "sqlite": [
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        ],
        "postgresql": [
            f"CREATE FUNCTION {name}() RETURNS trigger AS "
            f"$$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {name}()",
        ],
        "mariadb": [
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} FOR EACH ROW "
            f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{MESSAGE}'"
        ],
    }[dialect]
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)


def allow_deletes(engine: sa.Engine, table: str, dialect: str) -> None:
    name = f"refuse_{table}"
    on = f" ON {table}" if dialect == "postgresql" else ""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TRIGGER {name}{on}")


@contextmanager
def unpersisting(client: redis.Redis) -> Iterator[None]:
    """The server behind ``client`` unable to persist until exit, as on a full disk: its
    snapshot file is a non-empty directory, so a snapshot cannot be renamed onto it, and
    one is asked for. Until the next one succeeds (asked for on exit, with the file
    back), Redis refuses every write, PING included, with ``MISCONF``."""
    config = client.config_get("dir") | client.config_get("dbfilename")
    directory, filename = config["dir"], config["dbfilename"]
    assert directory is not None and filename is not None
    snapshot = Path(directory) / filename
    kept = snapshot.with_name(snapshot.name + ".kept")
    if snapshot.exists():
        snapshot.rename(kept)
    (snapshot / "blocked").mkdir(parents=True)
    try:
        _snapshot(client, "err")
        yield
    finally:
        shutil.rmtree(snapshot)
        if kept.exists():
            kept.rename(snapshot)
        _snapshot(client, "ok")


def _snapshot(client: redis.Redis, expected: str, timeout: float = 30.0) -> None:
    """A snapshot asked for and waited for: its status must become ``expected``."""
    deadline = time.monotonic() + timeout
    while client.info("persistence")["rdb_bgsave_in_progress"]:
        assert time.monotonic() < deadline, "a snapshot already running did not end"
        time.sleep(0.02)
    client.bgsave()
    while True:
        info = client.info("persistence")
        if not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == expected:
            return
        assert time.monotonic() < deadline, f"the snapshot's status is not {expected}: {info}"
        time.sleep(0.02)
