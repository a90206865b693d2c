"""A statement that waits for a lock another session holds gives up after the lock
timeout (``CELLSIGHT_DB_LOCK_TIMEOUT``) with ``LockWaitTimeout``, on every dialect.

Found from outside: ``index verify``, ``index sync`` and ``index status`` waited as long
as a migration's table lock was held (PostgreSQL's ``lock_timeout`` is off by default,
MariaDB's ``lock_wait_timeout`` a day), holding the maintenance lock meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from cellsight.api.driver_errors import is_timeout
from cellsight.cells.database import Engines, connect, write_transaction
from cellsight.cells.errors import DatabaseUnavailable, LockWaitTimeout
from cellsight.cells.mappings import CellRegistry

LOCK_TIMEOUT = 1.0
probe = sa.Table("lock_probe", sa.MetaData(), sa.Column("n", sa.Integer))


@pytest.fixture
def table(registry: CellRegistry) -> str:
    probe.create(registry.api_engine)
    with write_transaction(registry.api_engine) as conn:
        conn.execute(probe.insert(), [{"n": 1}])
    return registry.api_url


@pytest.fixture
def held(registry: CellRegistry, table: str) -> Iterator[str]:
    """Another session holds the strongest lock its dialect has on the table: what a
    migration's ``ALTER TABLE`` takes (SQLite: the database's write lock)."""
    dialect = registry.api_engine.dialect.name
    holder = registry.api_engine.connect()
    try:
        if dialect == "sqlite":
            holder = holder.execution_options(sqlite_begin="IMMEDIATE")
            holder.begin()
            holder.execute(probe.insert(), [{"n": 2}])
        elif dialect == "postgresql":
            holder.begin()
            holder.exec_driver_sql("LOCK TABLE lock_probe IN ACCESS EXCLUSIVE MODE")
        else:
            holder.exec_driver_sql("LOCK TABLES lock_probe WRITE")
        yield dialect
    finally:
        if dialect not in ("sqlite", "postgresql"):
            holder.exec_driver_sql("UNLOCK TABLES")
        holder.close()


def _gives_up(action: str, url: str) -> tuple[LockWaitTimeout, float]:
    engines = Engines(connect_timeout=5, lock_timeout=LOCK_TIMEOUT)
    engine = engines.get(url)
    started = time.monotonic()
    try:
        with pytest.raises(LockWaitTimeout) as caught:
            if action == "read":
                with connect(engine) as conn:
                    conn.execute(sa.select(sa.func.count()).select_from(probe)).scalar_one()
            else:
                with write_transaction(engine) as conn:
                    conn.execute(probe.insert(), [{"n": 3}])
        return caught.value, time.monotonic() - started
    finally:
        engines.dispose()


@pytest.mark.parametrize("action", ["read", "write"])
def test_a_statement_gives_up_on_a_held_lock(
    held: str, action: str, registry: CellRegistry
) -> None:
    if held == "sqlite" and action == "read":
        # WAL: a reader never waits for the writer; it reads what was committed.
        engines = Engines(connect_timeout=5, lock_timeout=LOCK_TIMEOUT)
        try:
            with connect(engines.get(registry.api_url)) as conn:
                assert conn.execute(sa.select(probe.c.n)).scalars().all() == [1]
        finally:
            engines.dispose()
        return
    error, waited = _gives_up(action, registry.api_url)
    # It waited for the lock, then stopped: neither at once nor as long as the lock is held.
    assert LOCK_TIMEOUT * 0.8 <= waited < LOCK_TIMEOUT + 10
    assert isinstance(error, DatabaseUnavailable)  # what callers already skip and name
    assert "is busy" in error.message and "CELLSIGHT_DB_LOCK_TIMEOUT" in error.message
    assert "SELECT" not in error.message and "INSERT" not in error.message  # no SQL text
    assert is_timeout(error)  # the API's fan-out reports the cell as timed out


def test_the_engine_works_again_once_the_lock_is_gone(registry: CellRegistry, table: str) -> None:
    holder = registry.api_engine.connect()
    engines = Engines(connect_timeout=5, lock_timeout=LOCK_TIMEOUT)
    try:
        engine = engines.get(registry.api_url)
        if engine.dialect.name == "postgresql":
            holder.begin()
            holder.exec_driver_sql("LOCK TABLE lock_probe IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(LockWaitTimeout), connect(engine) as conn:
                conn.execute(sa.select(probe.c.n)).all()
            holder.rollback()
        with write_transaction(engine) as conn:
            conn.execute(probe.insert(), [{"n": 4}])
        with connect(engine) as conn:
            assert sorted(conn.execute(sa.select(probe.c.n)).scalars()) == [1, 4]
    finally:
        holder.close()
        engines.dispose()


def test_each_dialect_carries_the_lock_timeout(registry: CellRegistry) -> None:
    """The setting reaches the session, in the dialect's own unit."""
    engines = Engines(connect_timeout=5, lock_timeout=2.5)
    try:
        engine = engines.get(registry.api_url)
        with connect(engine) as conn:
            name = engine.dialect.name
            if name == "sqlite":
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 2500
            elif name == "postgresql":
                assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "2500ms"
            else:
                row = conn.exec_driver_sql(
                    "SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout"
                ).one()
                assert tuple(int(v) for v in row) == (3, 3)  # whole seconds, rounded up
    finally:
        engines.dispose()
