"""The cell contract: one suite, unchanged on SQLite, PostgreSQL and MariaDB.

Here the storage side: schema and rows, reads and seeding, named errors. The operations
are in ``test_cells_operations.py``, the ones that fail or are refused in
``test_cells_refusals.py``; the fixtures of all three in ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import Engines, connect, write_transaction
from cellsight.cells.errors import BadDatabaseURL, DatabaseUnavailable, UnknownCell
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.outbox import Outbox
from cellsight.cells.reads import (
    count_instances,
    iter_instance_batches,
    iter_instances,
    iter_versions,
    list_compute_nodes,
)
from cellsight.cells.rows import payload_to_row, row_to_payload
from cellsight.cells.schema import cell_metadata, instances
from cellsight.cells.seed import SeedReport, seed
from cellsight.notifications.envelope import Notification
from cellsight.notifications.errors import PublishError
from cellsight.notifications.payloads import (
    InstanceActionPayload,
    InstanceCreatePayload,
    InstancePayload,
    InstanceUpdatePayload,
)
from tests.support.cell_contract import NOW, full_payload, row_of
from tests.support.publishers import CollectingPublisher
from tests.support.services import DatabaseFactory

# ---------------------------------------------------------------- schema and rows


def test_schema_has_tables_and_indexes(registry: CellRegistry, cell: CellMapping) -> None:
    inspector = sa.inspect(registry.cell_engine(cell))
    assert {"instances", "compute_nodes"} <= set(inspector.get_table_names())
    names = {ix["name"] for ix in inspector.get_indexes("instances")}
    assert {ix.name for ix in cell_metadata.tables["instances"].indexes} <= names
    api = sa.inspect(registry.api_engine)
    assert {"cell_mappings", "instance_mappings"} <= set(api.get_table_names())


def test_full_row_round_trip_and_inverse(registry: CellRegistry, cell: CellMapping) -> None:
    payload = full_payload()
    row = payload_to_row(payload)
    with write_transaction(registry.cell_engine(cell)) as conn:
        conn.execute(instances.insert().values(**row))
    stored = row_of(registry, cell, payload.uuid)
    assert stored is not None
    assert {k: stored[k] for k in row} == row  # JSON, unicode, microseconds, booleans
    assert stored["created_at"] == NOW - timedelta(days=3, microseconds=1)
    assert stored["created_at"].tzinfo is not None
    back = row_to_payload(stored, payload.cell_uuid, InstanceCreatePayload)
    assert back == payload
    assert back.to_primitive() == payload.to_primitive()
    assert payload_to_row(back) == row


def test_payload_classes_carry_only_their_fields(registry: CellRegistry, cell: CellMapping) -> None:
    row = payload_to_row(full_payload())
    action = row_to_payload(row, cell.uuid, InstanceActionPayload)
    data = action.to_primitive()["nova_object.data"]
    assert "keypairs" not in data and "instance_name" not in data
    assert data["tags"] == ["prod", "web"]  # on every event, so the index keeps them
    update = row_to_payload(row, cell.uuid, InstanceUpdatePayload)
    assert update.tags == ["prod", "web"]
    data = update.to_primitive()["nova_object.data"]
    assert (data["revision"], data["cell_uuid"], data["forthcoming"]) == (7, cell.uuid, True)


# ------------------------------------------------------------ reads and seeding


def test_seed_keyset_iteration_and_counts(
    registry: CellRegistry, make_database: Any, dialect: str, tmp_path: Any
) -> None:
    report = seed(
        registry,
        cells=2,
        instances_per_cell=150,
        cells_dir=tmp_path,
        db_urls=[make_database(dialect), make_database(dialect)],
        seed=7,
        now=NOW,
        chunk_size=40,
    )
    assert (report.instances, report.mappings) == (300, 300)
    assert registry.count_mappings() == 300
    for cell in report.cells:
        assert registry.count_mappings(cell.uuid) == 150
        with connect(registry.cell_engine(cell)) as conn:
            rows = list(iter_instances(conn, batch_size=7))
            uuids = [r["uuid"] for r in rows]
            assert uuids == sorted(uuids) and len(set(uuids)) == 150
            assert count_instances(conn) == 150
            live = count_instances(conn, include_deleted=False)
            assert live == sum(1 for r in rows if not r["deleted"]) and 0 < live < 150
            project = rows[0]["project_id"]
            assert count_instances(conn, project_id=project) == sum(
                1 for r in rows if r["project_id"] == project
            )
            # Resuming after any uuid continues exactly there.
            tail = [r["uuid"] for r in iter_instances(conn, batch_size=10, after_uuid=uuids[41])]
            assert tail == uuids[42:]
            batches = list(iter_instance_batches(conn, batch_size=50))
            assert [len(b) for b in batches] == [50, 50, 50]
            versions = list(iter_versions(conn, batch_size=13))
            assert versions == [(r["uuid"], r["revision"]) for r in rows]
            nodes = list_compute_nodes(conn)
            assert sum(n["vcpus_used"] for n in nodes) == sum(
                r["vcpus"] for r in rows if r["host"] and not r["deleted"]
            )
        for row in rows:
            payload = row_to_payload(row, cell.uuid, InstanceCreatePayload)
            assert payload_to_row(payload) == {k: v for k, v in row.items() if k != "id"}
        spread = {
            key: {r[key] for r in rows}
            for key in ("project_id", "vm_state", "host", "flavor_name", "display_name")
        }
        assert len(spread["project_id"]) >= 5 and len(spread["vm_state"]) >= 4
        assert len(spread["host"]) >= 3 and len(spread["flavor_name"]) >= 4
        assert len(spread["display_name"]) >= 100
        assert all(r["created_at"] < NOW for r in rows)
        assert len({r["created_at"].date() for r in rows}) > 50


def test_seed_is_deterministic_serial_or_parallel(
    make_database: Any, dialect: str, tmp_path: Any
) -> None:
    def run(workers: int) -> tuple[list[tuple[Any, ...]], int]:
        registry = CellRegistry(make_database(dialect))
        registry.create_schema()
        try:
            report = seed(
                registry,
                cells=2,
                instances_per_cell=40,
                cells_dir=tmp_path,
                db_urls=[make_database(dialect), make_database(dialect)],
                seed=3,
                now=NOW,
                chunk_size=15,
                workers=workers,
            )
            assert (report.instances, report.mappings) == (80, 80)
            found = []
            for cell in report.cells:
                with connect(registry.cell_engine(cell)) as conn:
                    found += [
                        (cell.uuid, r["uuid"], r["display_name"], r["host"], r["created_at"])
                        for r in iter_instances(conn)
                    ]
                assert registry.count_mappings(cell.uuid) == 40
            return found, report.compute_nodes
        finally:
            registry.close()

    serial = run(workers=1)
    assert len(serial[0]) == 80
    assert run(workers=1) == serial
    assert run(workers=2) == serial  # worker processes make the same cells


def _seed_25_in_chunks_of_10(
    registry: CellRegistry, url: str, tmp_path: Any, publisher: CollectingPublisher
) -> SeedReport:
    return seed(
        registry,
        cells=1,
        instances_per_cell=25,
        cells_dir=tmp_path,
        db_urls=[url],
        chunk_size=10,
        publisher=publisher,
        now=NOW,
    )


def test_seed_notifies_each_instance_after_commit(
    registry: CellRegistry, make_database: Any, dialect: str, tmp_path: Any
) -> None:
    publisher = CollectingPublisher()
    report = _seed_25_in_chunks_of_10(registry, make_database(dialect), tmp_path, publisher)
    assert report.notifications == 25
    assert set(publisher.event_types) == {"instance.create.end"}
    with connect(registry.cell_engine(report.cells[0])) as conn:
        rows = {r["uuid"]: r for r in iter_instances(conn)}
    for sent in publisher.sent:
        payload = sent.payload
        assert isinstance(payload, InstanceCreatePayload)
        row = rows[payload.uuid]
        assert (payload.revision, payload.cell_uuid) == (row["revision"], report.cells[0].uuid)
        # Through the outbox: decoded from its JSON, so compared by content (a decoded
        # object also remembers the wire version it was read at).
        expected = row_to_payload(row, report.cells[0].uuid, InstanceCreatePayload)
        assert payload.model_dump() == expected.model_dump()


class BusFailsAfterFirstPublish(CollectingPublisher):
    """Takes the first batch, then fails as the Notifier does when the bus goes away."""

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        if self.sent:
            raise PublishError("bus down (test)")
        super().publish_many(notifications)


def test_a_bus_failing_mid_seed_leaves_the_rest_in_the_outbox(
    registry: CellRegistry, make_database: Any, dialect: str, tmp_path: Any
) -> None:
    publisher = BusFailsAfterFirstPublish()
    report = _seed_25_in_chunks_of_10(registry, make_database(dialect), tmp_path, publisher)
    # The first chunk was published; the second chunk's publish failed after its commit,
    # the third was not tried: both wait in the outbox, none is lost.
    assert (report.instances, report.notifications, report.waiting) == (25, 10, 15)
    engine = registry.cell_engine(report.cells[0])
    relayed = CollectingPublisher()
    assert Outbox(relayed).relay(engine).published == 15
    with connect(engine) as conn:
        assert outbox.pending(conn) == 0
        rows = {r["uuid"] for r in iter_instances(conn)}
    told = [cast(InstancePayload, n.payload).uuid for n in publisher.sent + relayed.sent]
    assert sorted(told) == sorted(rows) and len(rows) == 25


# ------------------------------------------------------------------ named errors


def test_bad_urls_and_unknown_cells_are_named(registry: CellRegistry, dialect: str) -> None:
    bad = {
        "sqlite": "sqlite://",
        "postgresql": "postgresql+psycopg2://u@h/db",
        "mariadb": "mysql+mysqldb://root@127.0.0.1/x",
    }[dialect]
    with pytest.raises(BadDatabaseURL) as caught:
        registry.add_cell("bad", bad)
    assert bad.split(":")[0] in caught.value.message
    with pytest.raises(BadDatabaseURL, match="unsupported database 'oracle'"):
        registry.add_cell("bad", "oracle://scott:tiger@db/orcl")
    unreachable = {
        "sqlite": "sqlite:////proc/no/such/dir/cell.db",
        "postgresql": "postgresql://u:secret@127.0.0.1:1/db",
        "mariadb": "mysql://root:secret@127.0.0.1:1/db",
    }[dialect]
    with pytest.raises(DatabaseUnavailable) as unavailable:
        registry.add_cell("down", unreachable)
    assert "secret" not in str(unavailable.value)
    with pytest.raises(UnknownCell, match=r"'nope' \(no cells registered"):
        registry.get_cell("nope")


def end_own_session(engine: sa.Engine, conn: sa.Connection, pg: bool) -> None:
    """The server ends ``conn``'s session, as a restart or a failover does."""
    own = conn.execute(sa.text("SELECT pg_backend_pid()" if pg else "SELECT CONNECTION_ID()"))
    session = own.scalar_one()
    with engine.connect() as other:
        kill = f"SELECT pg_terminate_backend({session})" if pg else f"KILL {session}"
        other.execute(sa.text(kill))


@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_a_server_lost_mid_use_is_database_unavailable(
    make_database: DatabaseFactory, server: str
) -> None:
    """The server ends this connection's session (as a restart or a failover does)
    between two statements: the next one raises ``DatabaseUnavailable``, which callers
    refuse or retry, not the driver's error; the engine then reconnects."""
    pg = server == "postgresql"
    engines = Engines(connect_timeout=5)
    try:
        engine = engines.get(make_database(server))
        with pytest.raises(DatabaseUnavailable) as lost, connect(engine) as conn:
            end_own_session(engine, conn, pg)
            conn.execute(sa.text("SELECT 1")).scalar_one()
        assert engine.url.database is not None
        assert engine.url.database in str(lost.value)
        with connect(engine) as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    finally:
        engines.dispose()


@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_a_server_lost_after_the_last_statement_is_database_unavailable(
    make_database: DatabaseFactory, server: str
) -> None:
    """The session ends after the last statement, before the connection is given back:
    the rollback that ends its implicit transaction fails, and that too is
    ``DatabaseUnavailable``, not the driver's error (the soak's producer met it)."""
    pg = server == "postgresql"
    engines = Engines(connect_timeout=5)
    try:
        engine = engines.get(make_database(server))
        with pytest.raises(DatabaseUnavailable), connect(engine) as conn:
            end_own_session(engine, conn, pg)
        with connect(engine) as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    finally:
        engines.dispose()


def test_statement_timeout_interrupts_a_slow_query(registry: CellRegistry) -> None:
    probe = sa.Table("slow_probe", sa.MetaData(), sa.Column("n", sa.Integer))
    probe.create(registry.api_engine)
    with write_transaction(registry.api_engine) as conn:
        conn.execute(probe.insert(), [{"n": i} for i in range(1000)])
    a, b, c = probe.alias("a"), probe.alias("b"), probe.alias("c")
    # 10^9 row combinations: minutes of work on any of the three.
    slow = sa.select(sa.func.count()).select_from(a, b, c).where(a.c.n + b.c.n > c.c.n)
    engines = Engines(connect_timeout=5, statement_timeout=0.3)
    try:
        engine = engines.get(registry.api_url)
        started = datetime.now(UTC)
        with pytest.raises(sa.exc.DBAPIError), connect(engine) as conn:
            conn.execute(slow).scalar()
        assert datetime.now(UTC) - started < timedelta(seconds=5)
        with connect(engine) as conn:  # the engine stays usable
            assert conn.execute(sa.select(sa.func.count()).select_from(probe)).scalar() == 1000
    finally:
        engines.dispose()


def test_the_api_database_keeps_records_by_key(registry: CellRegistry) -> None:
    """Cellsight's own records in the API database (the purge floor), on every dialect."""
    assert registry.get_meta("purge_floor:instance") is None
    registry.put_meta("purge_floor:instance", {"before": "2026-01-01T00:00:00+00:00"})
    registry.put_meta("purge_floor:instance", {"before": "2026-02-01T00:00:00+00:00", "n": 2})
    registry.put_meta("other", {"é": "ü" * 300})
    assert registry.get_meta("purge_floor:instance") == {
        "before": "2026-02-01T00:00:00+00:00",
        "n": 2,
    }
    assert registry.get_meta("other") == {"é": "ü" * 300}
