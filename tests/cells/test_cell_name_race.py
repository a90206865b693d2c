"""Two registrations racing with names told apart only by case ("Race" and "race"):
the name check runs in Python (no index of the three dialects folds case alike), and on
the server dialects, at READ COMMITTED, both passed it and both cells were registered.
Registrations now wait for each other on a lock (``cells.cell_names``); SQLite's
``BEGIN IMMEDIATE`` already serialized them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cells.cell_names import hold_registration_lock, prepare_registration_lock
from cellsight.cells.database import write_transaction
from cellsight.cells.errors import DuplicateCell
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.schema import cell_mappings, utcnow
from tests.support.services import DatabaseFactory

# What shows a transaction waiting for a row lock, by dialect.
WAITING = {
    "postgresql": "SELECT count(*) FROM pg_locks WHERE NOT granted",
    "mariadb": "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
}


def _wait_for_a_waiter(
    url: str, dialect: str, racer: threading.Thread, outcome: list[BaseException | str]
) -> None:
    """Until the racing registration waits on a lock (it may first make its database),
    or it ended: without the lock, it never waits."""
    watcher = sa.create_engine(url, poolclass=sa.pool.NullPool)
    deadline = time.monotonic() + 60
    try:
        with watcher.connect() as conn:
            while racer.is_alive() and time.monotonic() < deadline:
                if conn.execute(sa.text(WAITING[dialect])).scalar_one():
                    return
                conn.rollback()  # a fresh snapshot each look
                # MariaDB refreshes innodb_trx only after 0.1 s without a read of it:
                # looking more often, it would show the first look's answer forever.
                racer.join(0.25)
    finally:
        watcher.dispose()
    pytest.fail(f"the racing registration never waited for the first one's lock: {outcome!r}")


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"])
def test_a_registration_waits_for_a_racing_one_and_then_finds_its_name_taken(
    dialect: str, make_database: DatabaseFactory, tmp_path: Path
) -> None:
    api_url = make_database(dialect)
    registry = CellRegistry(api_url)
    registry.create_schema()
    outcome: list[BaseException | str] = []

    def race() -> None:
        try:
            outcome.append(registry.add_cell("race", f"sqlite:///{tmp_path / 'second.db'}").name)
        except BaseException as exc:
            outcome.append(exc)

    try:
        prepare_registration_lock(registry.api_engine)
        racer = threading.Thread(target=race)
        with write_transaction(registry.api_engine) as conn:
            # The first registration, between its check and its commit.
            hold_registration_lock(conn)
            conn.execute(
                cell_mappings.insert().values(
                    uuid="00000000-0000-4000-8000-000000000001",
                    name="Race",
                    database_connection=f"sqlite:///{tmp_path / 'first.db'}",
                    disabled=False,
                    created_at=utcnow(),
                )
            )
            racer.start()
            _wait_for_a_waiter(api_url, dialect, racer, outcome)
        racer.join(60)
        assert len(outcome) == 1
        assert isinstance(outcome[0], DuplicateCell), outcome
        assert "as 'Race'" in str(outcome[0])
        assert [c.name for c in registry.list_cells()] == ["Race"]
    finally:
        registry.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mariadb"])
def test_the_lock_record_is_made_once_and_is_not_a_cell(
    dialect: str, make_database: DatabaseFactory, tmp_path: Path
) -> None:
    registry = CellRegistry(make_database(dialect))
    registry.create_schema()
    try:
        for name in ("a", "b"):
            registry.add_cell(name, f"sqlite:///{tmp_path / name}.db")
        prepare_registration_lock(registry.api_engine)  # again: a no-op, not a key error
        assert [c.name for c in registry.list_cells()] == ["a", "b"]
    finally:
        registry.close()
