"""A database server that stops answering without closing its connections is left once
a statement's bound has passed, on every server dialect and at every moment a
connection waits on it: the handshake, the pool's ping, a statement, a commit. The
periodic outbox relay goes on with the other cells meanwhile.

Found from outside (a database-fault probe): psycopg waits for an answer with no bound
(the frozen server is the one to enforce ``statement_timeout``), PyMySQL's connect
timeout does not cover the handshake, and the periodic relay visited cells one after
the other, so one frozen cell held every cell's notifications.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.api.driver_errors import is_cell_failure
from cellsight.cells.answer_bound import NoAnswer, Watchdog
from cellsight.cells.database import Engines, connect, write_transaction
from cellsight.cells.dialects import backstop
from cellsight.cells.errors import DatabaseUnavailable
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox, pending
from cellsight.cells.relay_loop import start_periodic_relay
from tests.support.proxy import Proxy
from tests.support.publishers import CollectingPublisher, FailingPublisher
from tests.support.services import create_database, drop_database, server_fixture
from tests.support.waiting import wait_for

STATEMENT = 1.0
CONNECT = 2.0


def test_a_watch_that_ends_in_time_is_never_fired() -> None:
    dog = Watchdog()
    fired: list[str] = []
    last = threading.Event()
    early = dog.arm(0.05, lambda: fired.append("early"))
    assert dog.disarm(early) is False

    def late() -> None:
        fired.append("late")
        last.set()

    dog.arm(0.1, late)
    # The later deadline firing proves the earlier one was passed over, not pending.
    assert last.wait(10)
    assert fired == ["late"]


def test_watches_of_several_bounds_fire_in_deadline_order() -> None:
    dog = Watchdog()
    fired: list[float] = []
    done = threading.Event()
    for seconds in (0.3, 0.1, 0.2):

        def fire(s: float = seconds) -> None:
            fired.append(s)
            if len(fired) == 3:
                done.set()

        dog.arm(seconds, fire)
    assert done.wait(10)
    assert fired == [0.1, 0.2, 0.3]


def test_disarmed_watches_leave_nothing_behind() -> None:
    dog = Watchdog()
    for _ in range(10_000):
        dog.disarm(dog.arm(300.0, lambda: None))
    assert all(not queue for queue in dog._due.values())


def test_a_drop_that_fails_leaves_the_watchdog_watching() -> None:
    """A review: a drop raising anything but ``OSError`` (psycopg's "the connection is
    lost", once libpq has lost it) ended the thread, and no later deadline fired."""
    dog = Watchdog()
    fired = threading.Event()

    def lost() -> None:
        raise RuntimeError("the connection is lost")

    dog.arm(0.01, lost)
    dog.arm(0.05, fired.set)
    assert fired.wait(10)
    assert dog._thread is not None and dog._thread.is_alive()


@pytest.fixture(params=["postgresql", "mariadb"])
def frozen(request: pytest.FixtureRequest) -> Iterator[tuple[Proxy, sa.Engine]]:
    """An engine with the API's kind of bounds, on a real server behind a proxy."""
    server: sa.URL = request.getfixturevalue(server_fixture(request.param))
    name, url = create_database(server)
    proxy = Proxy((server.host or "127.0.0.1", server.port or 0))
    proxy.start()
    engines = Engines(connect_timeout=CONNECT, statement_timeout=STATEMENT)
    try:
        yield proxy, engines.get(sa.make_url(url).set(port=proxy.port).render_as_string(False))
    finally:
        engines.dispose()
        proxy.stop()
        drop_database(server, name)


def _fails_in_time(engine: sa.Engine, action: str, proxy: Proxy) -> DatabaseUnavailable:
    # The slowest path: a ping that gets no answer, then a new connection that gets none.
    bound = backstop(STATEMENT) + CONNECT + backstop(STATEMENT) + 1.0
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as caught:
        if action == "connect":
            proxy.freeze()
            with connect(engine) as conn:
                conn.exec_driver_sql("SELECT 1")
        elif action == "statement":
            with connect(engine) as conn:
                conn.exec_driver_sql("SELECT 1")
                proxy.freeze()
                conn.exec_driver_sql("SELECT 2")
        else:
            with write_transaction(engine) as conn:
                conn.exec_driver_sql("SELECT 1")
                proxy.freeze()  # the commit is what waits
    assert time.monotonic() - started < bound
    assert is_cell_failure(caught.value)
    return caught.value


@pytest.mark.parametrize("action", ["connect", "statement", "commit"])
def test_a_server_that_stops_answering_is_left_after_the_bound(
    frozen: tuple[Proxy, sa.Engine], action: str
) -> None:
    proxy, engine = frozen
    with connect(engine) as conn:  # a pooled connection: the ping is what waits first
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    error = _fails_in_time(engine, action, proxy)
    if engine.dialect.name == "postgresql" and action != "connect":
        assert error.why == f"no answer from the server in {backstop(STATEMENT)} s"
        assert isinstance(error.__context__.orig, NoAnswer)  # type: ignore[union-attr]
    proxy.thaw()
    with connect(engine) as conn:  # the dropped connection is not handed out again
        assert conn.exec_driver_sql("SELECT 3").scalar_one() == 3


@pytest.mark.parametrize("needle", [b"hstore", b"isolation"])
def test_a_new_postgresql_connection_is_left_if_its_set_up_gets_no_answer(
    postgres_server: sa.URL, needle: bytes
) -> None:
    """A review: the queries SQLAlchemy runs on an engine's first connection (the hstore
    type's lookup, the isolation level) use the driver's cursor, which was not watched."""
    proxy = Proxy((postgres_server.host or "127.0.0.1", postgres_server.port or 0))
    proxy.start()
    engines = Engines(connect_timeout=CONNECT, statement_timeout=STATEMENT)
    try:
        proxy.freeze_on(needle)
        engine = engines.get(postgres_server.set(port=proxy.port).render_as_string(False))
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable), connect(engine) as conn:
            conn.exec_driver_sql("SELECT 1")
        assert time.monotonic() - started < backstop(STATEMENT) + CONNECT + 1.0
    finally:
        engines.dispose()
        proxy.stop()


def test_an_executemany_gets_the_bound_once_per_thousand_rows(postgres_server: sa.URL) -> None:
    """A review: a seed's chunk of 10,000 rows is one driver call, pipelined; under the
    bound of one statement a healthy load was cut short. (PostgreSQL only: PyMySQL's
    read timeout bounds each socket read, not a call.)"""
    name, url = create_database(postgres_server)
    proxy = Proxy((postgres_server.host or "127.0.0.1", postgres_server.port or 0))
    proxy.start()
    engines = Engines(connect_timeout=CONNECT, statement_timeout=STATEMENT)
    try:
        engine = engines.get(sa.make_url(url).set(port=proxy.port).render_as_string(False))
        with connect(engine) as conn:
            conn.exec_driver_sql("CREATE TABLE many (n integer)")
            conn.commit()
            rows = [{"n": n} for n in range(2_500)]
            proxy.freeze_on(b"INSERT INTO many")
            with pytest.raises(sa.exc.OperationalError) as caught:
                conn.execute(sa.text("INSERT INTO many (n) VALUES (:n)"), rows)
        assert isinstance(caught.value.orig, NoAnswer)
        expected = f"no answer from the server in {3 * backstop(STATEMENT)} s"
        assert str(caught.value.orig) == expected
    finally:
        engines.dispose()
        proxy.stop()
        drop_database(postgres_server, name)


def test_stopping_the_periodic_relay_waits_for_the_passes_under_way(tmp_path: Path) -> None:
    """A review: the relay's own threads were left running once it was stopped, and its
    caller then closed the publisher under them."""
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}", Engines(connect_timeout=5))
    registry.create_schema()
    cell = registry.add_cell("c1", f"sqlite:///{tmp_path / 'c1.db'}")
    add_compute_node(registry.cell_engine(cell), "h1", availability_zone="az1")
    Operations(registry, FailingPublisher()).boot(BootRequest("vm", "m1.small", "p1", "u1"))
    publishing, release = threading.Event(), threading.Event()

    class Slow(CollectingPublisher):
        def publish_many(self, notifications: Any) -> None:
            publishing.set()
            release.wait(10)
            super().publish_many(notifications)

    slow = Slow()
    stop = threading.Event()
    thread = start_periodic_relay(registry, Outbox(slow), 0.05, stop, settle=10)
    try:
        assert publishing.wait(10)
        stop.set()
        thread.join(0.2)
        assert thread.is_alive()  # waiting for the pass under way
        release.set()
        thread.join(10)
        assert not thread.is_alive() and len(slow.sent) >= 4
        with connect(registry.cell_engine(cell)) as conn:
            assert pending(conn) == 0  # published, then deleted, before the loop ended
    finally:
        release.set()
        stop.set()
        registry.close()


def test_the_periodic_relay_goes_on_while_one_cell_does_not_answer(
    postgres_server: sa.URL, tmp_path: Path
) -> None:
    name, url = create_database(postgres_server)
    proxy = Proxy((postgres_server.host or "127.0.0.1", postgres_server.port or 0))
    proxy.start()
    # A long bound: the frozen cell holds its relay for all of this test.
    registry = CellRegistry(
        f"sqlite:///{tmp_path / 'api.db'}", Engines(connect_timeout=5, statement_timeout=60)
    )
    stop = threading.Event()
    thread = None
    try:
        registry.create_schema()
        far_url = sa.make_url(url).set(port=proxy.port).render_as_string(False)
        far = registry.add_cell("a-far", far_url)  # first in the relay's order
        near = registry.add_cell("b-near", f"sqlite:///{tmp_path / 'near.db'}")
        add_compute_node(registry.cell_engine(near), "h1", availability_zone="az1")
        Operations(registry, FailingPublisher()).boot(BootRequest("vm", "m1.small", "p1", "u1"))
        with connect(registry.cell_engine(near)) as conn:
            waiting = pending(conn)
        assert waiting >= 4
        with connect(registry.cell_engine(far)) as conn:
            conn.exec_driver_sql("SELECT 1")  # pooled: the relay's checkout pings it
        proxy.freeze()
        up = CollectingPublisher()
        thread = start_periodic_relay(registry, Outbox(up), 0.05, stop)

        def relayed() -> bool:
            with connect(registry.cell_engine(near)) as conn:
                return pending(conn) == 0  # published, confirmed, then deleted

        wait_for(relayed, timeout=10, what="the near cell's relay")
        assert len(up.sent) == waiting and up.event_types[0] == "instance.create.start"
    finally:
        stop.set()
        proxy.thaw()
        proxy.stop()
        registry.close()
        drop_database(postgres_server, name)
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
