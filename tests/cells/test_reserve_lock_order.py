"""A reservation placed by the scheduler against a change that locks nodes in id order,
on PostgreSQL and MariaDB, in one forced order of events (found by a concurrency probe:
3 deadlocks in about 20,000 cell transactions).

A claim whose node is full when its turn comes matches no row but keeps the lock it
waited for. So a reservation that tried its first pick (the node with the higher id,
full by then) and went on to the next held the two in the opposite order to a change
holding the lower one and waiting for the higher: a deadlock. The reservation now locks
its picks in id order before claiming (``lock_nodes``), as a boot does."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import register_node
from cellsight.cells.operations import Operations
from cellsight.cells.reservations import Reservations
from cellsight.cells.schema import compute_nodes
from tests.support.publishers import CollectingPublisher
from tests.support.services import DatabaseFactory

# Sessions of this test's database waiting for a lock.
WAITING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    # InnoDB's own table did not list these waits: the sessions still in a statement on
    # the nodes (each takes a millisecond when nothing holds its rows).
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
    "AND id <> CONNECTION_ID() AND command = 'Query' AND info LIKE '%compute_nodes%'",
}
NODE = {"vcpus": 8, "local_gb": 500, "cpu_allocation_ratio": 1.0}


@pytest.fixture(params=["postgresql", "mariadb"])
def ops(request: pytest.FixtureRequest, make_database: DatabaseFactory) -> Iterator[Operations]:
    registry = CellRegistry(make_database(request.param))
    registry.create_schema()
    registry.add_cell("cell1", make_database(request.param))
    ops = Operations(registry, CollectingPublisher(), publisher_id="probe")
    # h2 has the higher id and the most free memory: the scheduler's first pick.
    register_node(ops, "cell1", "h1", memory_mb=8192, **NODE)
    register_node(ops, "cell1", "h2", memory_mb=16384, **NODE)
    yield ops
    registry.close()


def _until_waiting(engine: sa.Engine, sessions: int, bound: float = 10.0) -> None:
    deadline = time.monotonic() + bound
    with engine.connect() as conn:
        while conn.execute(sa.text(WAITING[engine.dialect.name])).scalar_one() < sessions:
            assert time.monotonic() < deadline, f"{sessions} sessions never waited for locks"
            conn.rollback()  # a fresh look each time
            time.sleep(0.01)


def _lock(conn: sa.Connection, node_id: int) -> None:
    c = compute_nodes.c
    conn.execute(sa.select(c.id).where(c.id == node_id).with_for_update())


@pytest.mark.services
def test_a_reservation_whose_first_pick_fills_up_never_deadlocks(
    ops: Operations, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ops.registry.cell_engine(ops.registry.get_cell("cell1"))
    c = compute_nodes.c
    with engine.connect() as conn:
        ids = {host: node_id for host, node_id in conn.execute(sa.select(c.host, c.id))}
    h1, h2 = ids["h1"], ids["h2"]
    assert h1 < h2
    filler = engine.connect()
    filler_tx = filler.begin()  # holds h2, and fills it before letting go
    _lock(filler, h2)
    outcome: dict[str, Any] = {}

    def reserve() -> None:
        try:
            outcome["reserved"] = Reservations(ops).reserve(flavor="m1.tiny")
        except BaseException as exc:  # surfaced below
            outcome["reserved"] = exc

    def change() -> None:  # what a modify, a move or a live migration does: id order
        try:
            with engine.begin() as conn:
                _lock(conn, h1)
                _lock(conn, h2)
            outcome["changed"] = True
        except BaseException as exc:  # surfaced below
            outcome["changed"] = exc

    reserver = threading.Thread(target=reserve)
    changer = threading.Thread(target=change)
    with caplog.at_level(logging.INFO, logger="cellsight.cells.database"):
        try:
            reserver.start()
            _until_waiting(engine, 1)  # the reservation waits for h2
            changer.start()
            # Either the change holds h1 and waits for h2 (the code before), or it waits
            # for h1, which the reservation locked first: two sessions wait either way.
            _until_waiting(engine, 2)
            filler.execute(compute_nodes.update().where(c.id == h2).values(memory_mb_used=16384))
            filler_tx.commit()
        finally:
            filler.close()  # rolls back what was not committed: nothing waits on it after
            reserver.join(30)
            if changer.is_alive() or changer.ident is not None:
                changer.join(30)
    assert outcome["changed"] is True, outcome
    reserved = outcome["reserved"]
    assert not isinstance(reserved, BaseException), reserved
    assert reserved.payload is not None and reserved.payload.host == "h1"
    assert [r.getMessage() for r in caplog.records if "running it again" in r.getMessage()] == []
