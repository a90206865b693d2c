"""A real deadlock on PostgreSQL and MariaDB, built so that our transaction is the
victim: ``write_transaction`` names it ``TransactionConflict`` (by SQLSTATE or MySQL's
error number) and ``retry_conflicts`` runs it again, which then commits. A node's
registration, made a victim, is run again whole."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import Engines, retry_conflicts, write_transaction
from cellsight.cells.errors import TransactionConflict
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import NODE_UPDATE, register_node
from cellsight.cells.operations import Operations
from cellsight.cells.schema import compute_nodes
from cellsight.notifications.envelope import Notification
from tests.support.publishers import CollectingPublisher
from tests.support.services import DIALECTS, DatabaseFactory

ROWS = sa.table("counters", sa.column("id", sa.Integer), sa.column("v", sa.Integer))
# The competitor's session (by its server-side id) waiting for a row lock: queued behind
# our first lock (other tests' sessions on the same server do not count).
SESSION = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
WAITING = {
    "postgresql": "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = :session",
    "mysql": "SELECT count(*) FROM information_schema.innodb_trx "
    "WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = :session",
}


@pytest.fixture(params=["postgresql", "mariadb"])
def engine(request: pytest.FixtureRequest, make_database: DatabaseFactory) -> Iterator[sa.Engine]:
    engines = Engines(connect_timeout=5)
    engine = engines.get(make_database(request.param))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE counters (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)"))
        conn.execute(sa.text("CREATE TABLE ballast (id INTEGER PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO counters (id, v) VALUES (1, 0), (2, 0)"))
    yield engine
    engines.dispose()


def _add(conn: sa.Connection, row: int, amount: int) -> None:
    conn.execute(ROWS.update().where(ROWS.c.id == row).values(v=ROWS.c.v + amount))


def _until_waiting(engine: sa.Engine, session: int, bound: float = 10.0) -> None:
    deadline = time.monotonic() + bound
    waiting = sa.text(WAITING[engine.dialect.name]).bindparams(session=session)
    with engine.connect() as conn:
        while conn.execute(waiting).scalar_one() == 0:
            assert time.monotonic() < deadline, "the competitor never queued for the lock"
            conn.rollback()  # a fresh snapshot each look (MariaDB's repeatable reads)


@pytest.mark.services
def test_a_deadlock_victim_is_named_and_runs_again(engine: sa.Engine) -> None:
    postgres = engine.dialect.name == "postgresql"
    first_locked, second_locked = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    session: list[int] = []

    def competitor() -> None:  # plain SQLAlchemy: never retried
        try:
            with engine.begin() as conn:
                session.append(conn.execute(sa.text(SESSION[engine.dialect.name])).scalar_one())
                if postgres:  # it waits longest, so our side finds the cycle and yields
                    conn.execute(sa.text("SET LOCAL deadlock_timeout = '30s'"))
                else:  # InnoDB rolls back the lighter transaction: make this one heavy
                    ballast = [{"id": n} for n in range(200)]
                    conn.execute(sa.table("ballast", sa.column("id")).insert(), ballast)
                _add(conn, 2, 1)
                second_locked.set()
                first_locked.wait(10)
                _add(conn, 1, 1)
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    attempts: list[BaseException | None] = []

    def ours() -> int:
        try:
            with write_transaction(engine) as conn:
                if postgres:
                    conn.execute(sa.text("SET LOCAL deadlock_timeout = '100ms'"))
                _add(conn, 1, 10)
                if not attempts:
                    first_locked.set()
                    _until_waiting(engine, session[0])  # it holds row 2 and wants row 1
                _add(conn, 2, 10)
                value: int = conn.execute(sa.select(ROWS.c.v).where(ROWS.c.id == 1)).scalar_one()
        except TransactionConflict as exc:
            attempts.append(exc)
            raise
        attempts.append(None)
        return value

    thread = threading.Thread(target=competitor)
    thread.start()
    assert second_locked.wait(10)
    seen = retry_conflicts(ours)
    thread.join(30)
    assert failures == []
    assert [type(a) for a in attempts] == [TransactionConflict, type(None)]
    assert "deadlock" in str(attempts[0]).lower()
    assert seen == 11  # the competitor's +1 committed while ours waited to run again
    with engine.connect() as conn:
        stored = {r.id: r.v for r in conn.execute(sa.select(ROWS.c.id, ROWS.c.v))}
    assert stored == {1: 11, 2: 11}


@pytest.mark.services
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_node_registration_chosen_as_a_victim_registers_once(
    dialect: str, make_database: DatabaseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The victim is rolled back whole (its row and its outbox entry) and run again: one
    # node, one announcement, no DuplicateHost from the first attempt's insert.
    registry = CellRegistry(make_database(dialect))
    registry.create_schema()
    try:
        cell = registry.add_cell("cell1", make_database(dialect))
        publisher = CollectingPublisher()
        ops = Operations(registry, publisher, publisher_id="t")
        add, attempts = outbox.add, []

        def victim_once(conn: sa.Connection, events: list[Notification]) -> None:
            attempts.append(len(events))
            if len(attempts) == 1:
                raise TransactionConflict(conn.engine.url, "deadlock detected (injected)")
            add(conn, events)

        monkeypatch.setattr(outbox, "add", victim_once)
        made = register_node(ops, "cell1", "h1")
        assert attempts == [1, 1]
        with registry.cell_engine(cell).connect() as conn:
            rows = conn.execute(sa.select(compute_nodes.c.uuid)).scalars().all()
        assert rows == [made.uuid]
        assert [n.event_type for n in publisher.take()] == [NODE_UPDATE]
    finally:
        registry.close()
