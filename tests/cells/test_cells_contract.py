"""The cell contract: one suite, unchanged on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells.database import Engines, connect, write_transaction
from cellsight.cells.errors import (
    BadDatabaseURL,
    DatabaseUnavailable,
    DuplicateInstance,
    InstanceLocked,
    InstanceNotFound,
    InvalidInstanceState,
    NoValidHost,
    UnknownCell,
    UnknownFlavor,
)
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import Actor, BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.reads import (
    count_instances,
    get_instance,
    iter_instance_batches,
    iter_instances,
    iter_versions,
    list_compute_nodes,
)
from cellsight.cells.rows import payload_to_row, row_to_payload
from cellsight.cells.scheduler import Scheduler
from cellsight.cells.schema import cell_metadata, instances
from cellsight.cells.seed import seed
from cellsight.notifications.payloads import (
    BlockDevicePayload,
    FlavorPayload,
    InstanceActionPayload,
    InstanceCreatePayload,
    InstanceUpdatePayload,
    IpPayload,
    KeypairPayload,
    SharePayload,
)
from tests.support.publishers import CollectingPublisher

NOW = datetime(2026, 3, 14, 15, 9, 26, 535897, tzinfo=UTC)


def full_payload(uuid: str = "178b0921-8f85-4257-88b6-2e743b5a975c") -> InstanceCreatePayload:
    """Every stored field set, nested objects, unicode and microsecond times included."""
    return InstanceCreatePayload(
        uuid=uuid,
        user_id="fake",
        tenant_id="6f70656e737461636b20342065766572",
        reservation_id="r-npxv0e40",
        display_name="Zürich-Ω サーバー",
        display_description="a long\ndescription",
        host_name="zurich",
        host="host1",
        node="host1",
        os_type="linux",
        architecture="x86_64",
        availability_zone="az1",
        flavor=FlavorPayload.model_validate(get_flavor("c1.large")),
        image_uuid="155d900f-4e14-4e4c-a73d-069cbf4541e6",
        key_name="my-key",
        kernel_id="",
        ramdisk_id="",
        created_at=NOW - timedelta(days=3, microseconds=1),
        launched_at=NOW - timedelta(days=3),
        updated_at=NOW,
        terminated_at=None,
        deleted_at=None,
        state="active",
        power_state="running",
        task_state=None,
        progress=0,
        ip_addresses=[
            IpPayload(
                label="private",
                mac="fa:16:3e:4c:2c:30",
                meta={"k": "v"},
                port_uuid="ce531f90-199f-48c0-816c-13e38010b442",
                version=4,
                address="192.168.1.3",
                device_name="tapce531f90-19",
            ),
            IpPayload(label="public", version=6, address="2001:db8::1"),
        ],
        block_devices=[
            BlockDevicePayload(
                device_name="/dev/vda", boot_index=0, delete_on_termination=True, volume_id="vol-1"
            )
        ],
        metadata={"env": "prod", "ключ": "значение"},
        auto_disk_config="MANUAL",
        locked=True,
        locked_reason="maintenance",
        request_id="req-5b6c791d",
        action_initiator_project="p",
        action_initiator_user="u",
        shares=[SharePayload(share_id="s1", status="active")],
        keypairs=[
            KeypairPayload(
                user_id="fake",
                name="my-key",
                type="ssh",
                public_key="ssh-ed25519 AAAA",
                fingerprint="1e:2c",
            )
        ],
        tags=["prod", "web"],
        trusted_image_certificates=["cert-1"],
        instance_name="instance-00000001",
        revision=7,
        forthcoming=True,
        cell_uuid="50b19ee9-775f-4868-b517-76bf166a9486",
    )


def boot(ops: Operations, **fields: Any) -> InstanceCreatePayload:
    request = BootRequest(
        **{
            "display_name": "web",
            "flavor": "m1.small",
            "project_id": "p1",
            "user_id": "u1",
            **fields,
        }
    )
    return ops.boot(request).instances[0]


def row_of(registry: CellRegistry, cell: CellMapping, uuid: str) -> dict[str, Any] | None:
    with connect(registry.cell_engine(cell)) as conn:
        return get_instance(conn, uuid)


def node_usage(registry: CellRegistry, cell: CellMapping) -> dict[str, tuple[int, int, int]]:
    with connect(registry.cell_engine(cell)) as conn:
        return {
            n["host"]: (n["vcpus_used"], n["memory_mb_used"], n["local_gb_used"])
            for n in list_compute_nodes(conn)
        }


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


# ------------------------------------------------------------------- operations


def test_boot_writes_row_mapping_and_events(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    result = ops.boot(BootRequest("web", "m1.small", "p1", "u1", count=2, tags=["b", "a"]))
    assert len(result.selections) == 2
    for choices in result.selections:
        assert len(choices) == 3  # chosen + 2 alternates
        assert {s.cell_uuid for s in choices} == {cell.uuid}
        assert len({s.service_host for s in choices}) == 3
    assert [t for t in publisher.event_types if t.startswith("instance.")] == (
        ["instance.create.start", "instance.update", "instance.create.end"] * 2
    )
    for payload in result.instances:
        mapping = registry.get_instance_mapping(payload.uuid)
        assert (mapping.cell_uuid, mapping.project_id, mapping.queued_for_delete) == (
            cell.uuid,
            "p1",
            False,
        )
        row = row_of(registry, cell, payload.uuid)
        assert row is not None and row["revision"] == 1 and row["vm_state"] == "active"
    start, update, end = publisher.sent[:3]
    assert isinstance(end.payload, InstanceCreatePayload)
    assert (end.payload.revision, end.payload.cell_uuid, end.payload.forthcoming) == (
        1,
        cell.uuid,
        False,
    )
    assert end.payload.tags == ["a", "b"]
    assert isinstance(start.payload, InstanceCreatePayload) and start.payload.revision == 0
    assert isinstance(update.payload, InstanceUpdatePayload)
    assert update.payload.state_update is not None
    assert (update.payload.state_update.old_state, update.payload.state_update.state) == (
        "building",
        "active",
    )
    used = node_usage(registry, cell)
    assert sum(u[0] for u in used.values()) == 2  # two m1.small, one VCPU each
    assert {result.selections[0][0].service_host, result.selections[1][0].service_host} == {
        h for h, u in used.items() if u[0]
    }


ACTIONS: list[
    tuple[str, Callable[[Operations, str], InstanceActionPayload], list[str], dict[str, Any]]
] = [
    (
        "power_off",
        lambda o, u: o.power_off(u),
        ["instance.power_off.start", "instance.update", "instance.power_off.end"],
        {"vm_state": "stopped", "power_state": "shutdown"},
    ),
    (
        "power_on",
        lambda o, u: o.power_on(u),
        ["instance.power_on.start", "instance.update", "instance.power_on.end"],
        {"vm_state": "active", "power_state": "running"},
    ),
    (
        "reboot",
        lambda o, u: o.reboot(u, hard=True),
        ["instance.reboot.start", "instance.update", "instance.reboot.end"],
        {"vm_state": "active", "task_state": None},
    ),
    (
        "resize",
        lambda o, u: o.resize(u, "m1.large"),
        ["instance.resize.start", "instance.update", "instance.resize.end"],
        {"flavor_name": "m1.large", "vcpus": 4, "memory_mb": 8192},
    ),
    (
        "live_migrate",
        lambda o, u: o.live_migrate(u, "host3"),
        [
            "instance.live_migration_post.start",
            "instance.update",
            "instance.live_migration_post.end",
        ],
        {"host": "host3", "node": "host3"},
    ),
    (
        "lock",
        lambda o, u: o.lock(u, "audit"),
        ["instance.lock"],
        {"locked": True, "locked_reason": "audit"},
    ),
    ("unlock", lambda o, u: o.unlock(u), ["instance.unlock"], {"locked": False}),
    (
        "rename",
        lambda o, u: o.rename(u, "renamed"),
        ["instance.update"],
        {"display_name": "renamed"},
    ),
    (
        "metadata",
        lambda o, u: o.update_metadata(u, {"a": "1", "b": "2"}, ["b"]),
        ["instance.update"],
        {"metadata": {"a": "1"}},
    ),
    ("tags", lambda o, u: o.set_tags(u, ["x", "y"]), ["instance.update"], {"tags": ["x", "y"]}),
    (
        "delete",
        lambda o, u: o.delete(u),
        ["instance.delete.start", "instance.update", "instance.delete.end"],
        {"vm_state": "deleted", "deleted": True},
    ),
]


def test_every_action_commits_bumps_revision_and_emits_after_commit(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops, cell=cell.name).uuid
    publisher.take()
    for name, act, events, expected in ACTIONS:
        before = row_of(registry, cell, uuid)
        assert before is not None
        returned = act(ops, uuid)
        after = row_of(registry, cell, uuid)
        assert after is not None
        assert after["revision"] == before["revision"] + 1, name
        assert after["updated_at"] > before["updated_at"], name
        assert {k: after[k] for k in expected} == expected, name
        # compute_node.update events are checked in test_node_events.py.
        sent = [n for n in publisher.take() if n.event_type.startswith("instance.")]
        assert [n.event_type for n in sent] == events, name
        assert returned.revision == after["revision"]
        # The last event carries the committed snapshot; a start the one before.
        assert sent[-1].payload.revision == after["revision"]  # type: ignore[attr-defined]
        assert sent[-1].payload.cell_uuid == cell.uuid  # type: ignore[attr-defined]
        if len(events) == 3:
            assert sent[0].payload.revision == before["revision"]  # type: ignore[attr-defined]
            update = sent[1].payload
            assert isinstance(update, InstanceUpdatePayload) and update.state_update is not None
            assert update.state_update.old_state == before["vm_state"]
            assert update.state_update.state == after["vm_state"]
    assert node_usage(registry, cell)["host3"] == (0, 0, 0)  # the delete gave it back


def test_rename_event_names_the_old_name(ops: Operations, publisher: CollectingPublisher) -> None:
    uuid = boot(ops, display_name="old").uuid
    publisher.take()
    ops.rename(uuid, "new")
    (update,) = publisher.take()
    assert isinstance(update.payload, InstanceUpdatePayload)
    assert (update.payload.old_display_name, update.payload.display_name) == ("old", "new")


def test_soft_delete_keeps_row_and_flags_mapping(
    registry: CellRegistry, cell: CellMapping, ops: Operations
) -> None:
    uuid = boot(ops).uuid
    ops.delete(uuid)
    row = row_of(registry, cell, uuid)
    assert row is not None
    assert (row["deleted"], row["vm_state"]) == (True, "deleted")
    assert row["deleted_at"] is not None and row["terminated_at"] == row["deleted_at"]
    mapping = registry.get_instance_mapping(uuid)
    assert (mapping.cell_uuid, mapping.queued_for_delete) == (cell.uuid, True)
    with pytest.raises(InvalidInstanceState, match="deleted"):
        ops.power_off(uuid)
    with connect(registry.cell_engine(cell)) as conn:
        assert count_instances(conn) == 1
        assert count_instances(conn, include_deleted=False) == 0


def _fail_on(action: str) -> Callable[[str, sa.Connection], None]:
    def hook(name: str, conn: sa.Connection) -> None:
        if name == action:
            raise RuntimeError(f"injected failure in {name}")

    return hook


def test_failed_action_rolls_back_and_emits_nothing(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops).uuid
    publisher.take()
    before = row_of(registry, cell, uuid)
    failing = Operations(registry, publisher, before_commit=_fail_on("power_off"))
    with pytest.raises(RuntimeError, match="injected"):
        failing.power_off(uuid)
    failing = Operations(registry, publisher, before_commit=_fail_on("delete"))
    with pytest.raises(RuntimeError, match="injected"):
        failing.delete(uuid)
    assert publisher.sent == []
    assert row_of(registry, cell, uuid) == before
    assert registry.get_instance_mapping(uuid).queued_for_delete is False


def test_failed_boot_removes_mapping_and_emits_nothing(
    registry: CellRegistry, cell: CellMapping, publisher: CollectingPublisher
) -> None:
    failing = Operations(registry, publisher, before_commit=_fail_on("create"))
    uuid = "0b3e7c4c-0000-4000-8000-000000000001"
    usage = node_usage(registry, cell)
    with pytest.raises(RuntimeError, match="injected"):
        boot(failing, uuids=[uuid])
    assert publisher.sent == []
    assert row_of(registry, cell, uuid) is None
    with pytest.raises(InstanceNotFound):
        registry.get_instance_mapping(uuid)
    assert node_usage(registry, cell) == usage


def test_unique_violation_in_cell_rolls_back_boot(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    # A row the API database does not know: the boot's mapping succeeds, its insert fails.
    uuid = "0b3e7c4c-0000-4000-8000-000000000002"
    with write_transaction(registry.cell_engine(cell)) as conn:
        conn.execute(instances.insert().values(**payload_to_row(full_payload(uuid))))
    usage = node_usage(registry, cell)
    with pytest.raises(DuplicateInstance, match=uuid):
        boot(ops, uuids=[uuid])
    assert publisher.sent == []
    with pytest.raises(InstanceNotFound):
        registry.get_instance_mapping(uuid)
    assert node_usage(registry, cell) == usage
    # The mapping side: a uuid already mapped is refused before any cell work.
    booted = boot(ops).uuid
    publisher.take()
    with pytest.raises(DuplicateInstance, match=booted):
        boot(ops, uuids=[booted])
    assert publisher.sent == []
    assert registry.get_instance_mapping(booted).cell_uuid == cell.uuid


def test_locked_instance_refuses_non_admin(
    registry: CellRegistry, cell: CellMapping, ops: Operations, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops).uuid
    ops.lock(uuid, "legal hold")
    publisher.take()
    owner = Actor(project_id="p1", user_id="u1", is_admin=False)
    with pytest.raises(InstanceLocked, match="legal hold"):
        ops.power_off(uuid, actor=owner)
    with pytest.raises(InstanceNotFound):
        ops.power_off(uuid, actor=Actor(project_id="other", is_admin=False))
    assert publisher.sent == []
    ops.power_off(uuid)  # an admin may
    ops.unlock(uuid, actor=owner)
    ops.power_on(uuid, actor=owner)
    row = row_of(registry, cell, uuid)
    assert row is not None and (row["vm_state"], row["action_initiator_project"]) == (
        "active",
        "p1",
    )


def test_invalid_requests_are_named(ops: Operations, publisher: CollectingPublisher) -> None:
    uuid = boot(ops).uuid
    publisher.take()
    with pytest.raises(InvalidInstanceState, match=r"power on.*'active'"):
        ops.power_on(uuid)
    with pytest.raises(UnknownFlavor, match=r"m9\.huge"):
        ops.resize(uuid, "m9.huge")
    with pytest.raises(InstanceNotFound, match="0b3e7c4c"):
        ops.power_off("0b3e7c4c-0000-4000-8000-00000000dead")
    with pytest.raises(NoValidHost):
        ops.live_migrate(uuid, "no-such-host")
    with pytest.raises(UnknownCell, match=r"'atlantis'.*cell1"):
        boot(ops, cell="atlantis")
    assert publisher.sent == []


# -------------------------------------------------------------------- scheduler


def test_scheduler_keeps_alternates_in_one_cell_and_respects_capacity(
    registry: CellRegistry, add_cell: Callable[..., CellMapping]
) -> None:
    small = add_cell(
        "small", hosts=("s1", "s2"), vcpus=4, memory_mb=8192, local_gb=100, cpu_allocation_ratio=1.0
    )
    big = add_cell("big", hosts=("b1", "b2", "b3"), vcpus=64, memory_mb=262_144, local_gb=4000)
    scheduler = Scheduler(registry, alternates=2)
    picks = scheduler.select_destinations(get_flavor("m1.medium"), count=3)
    assert len(picks) == 3
    assert {s.cell_uuid for choices in picks for s in choices} == {big.uuid}
    assert all(len(choices) == 3 for choices in picks)
    # Pinned to the small cell: two m1.large (4 VCPU each) fit, a third does not.
    picks = scheduler.select_destinations(get_flavor("m1.large"), count=2, cell="small")
    assert sorted(c[0].service_host for c in picks) == ["s1", "s2"]
    assert picks[0][0].limits is not None and picks[0][0].limits.vcpu == 4
    with pytest.raises(NoValidHost, match=r"3 x m1\.large"):
        scheduler.select_destinations(get_flavor("m1.large"), count=3, cell=small.uuid)
    with pytest.raises(NoValidHost, match="availability zone 'nowhere'"):
        scheduler.select_destinations(get_flavor("m1.tiny"), availability_zone="nowhere")


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


def test_seed_notifies_each_instance_after_commit(
    registry: CellRegistry, make_database: Any, dialect: str, tmp_path: Any
) -> None:
    publisher = CollectingPublisher()
    report = seed(
        registry,
        cells=1,
        instances_per_cell=25,
        cells_dir=tmp_path,
        db_urls=[make_database(dialect)],
        chunk_size=10,
        publisher=publisher,
        now=NOW,
    )
    assert report.notifications == 25
    assert set(publisher.event_types) == {"instance.create.end"}
    with connect(registry.cell_engine(report.cells[0])) as conn:
        rows = {r["uuid"]: r for r in iter_instances(conn)}
    for sent in publisher.sent:
        payload = sent.payload
        assert isinstance(payload, InstanceCreatePayload)
        row = rows[payload.uuid]
        assert (payload.revision, payload.cell_uuid) == (row["revision"], report.cells[0].uuid)
        assert payload == row_to_payload(row, report.cells[0].uuid, InstanceCreatePayload)


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
