"""Tables of the API database and of every cell database, portable across dialects.

Conventions (the same on SQLite, PostgreSQL and MariaDB/MySQL):

* **Time** is stored as naive UTC with microseconds (``UTCDateTime``): callers pass
  aware datetimes (naive ones are taken as UTC) and read aware UTC datetimes back.
  Naive storage because MySQL has no zone-carrying type; microseconds because the
  indexer orders events by them (MariaDB needs ``DATETIME(6)`` for that).
* **Strings compare by code point** everywhere (PostgreSQL ``COLLATE "C"``, MySQL
  ``utf8mb4_bin``, SQLite's default ``BINARY``), so every cell sorts exactly as
  Python's ``str`` does and the fan-out merge sort agrees with each cell's order.
* **UUIDs** are lowercase 36-character strings (``ascii_bin`` on MySQL: 36-byte keys).
* **Soft delete**: ``deleted`` is a boolean (Nova's ``deleted = id`` trick exists for
  unique constraints on soft-deleted rows; our only unique key, ``uuid``, never repeats),
  ``deleted_at`` and ``vm_state = 'deleted'`` are set, and the row stays.
* **revision** starts at 1 on insert and every change adds 1: it is the external
  document version the index writes carry.
* Nested Nova objects (flavor, IP addresses, block devices, shares, keypairs) are JSON
  columns holding the objects' plain field dicts (not the versioned wire wrapper).
  The flavor's id, name and sizes are also copied into columns for filters and sorts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect

MYSQL_NAMES = ("mysql", "mariadb")


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Naive UTC in the database, aware UTC in Python; microsecond precision."""

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in MYSQL_NAMES:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(sa.DateTime(timezone=False))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        # MySQL's zero date ('0000-00-00 00:00:00', old rows written without strict mode)
        # is no datetime: the driver hands it over as text, and it means "no date".
        if not isinstance(value, datetime):
            return None
        return value.replace(tzinfo=UTC)


def Str(length: int) -> sa.types.TypeEngine[str]:
    """A string that sorts by code point on every dialect (MySQL: the table default)."""
    return sa.String(length).with_variant(postgresql.VARCHAR(length, collation="C"), "postgresql")


def Uuid() -> sa.types.TypeEngine[str]:
    return (
        sa.String(36)
        .with_variant(postgresql.VARCHAR(36, collation="C"), "postgresql")
        .with_variant(mysql.VARCHAR(36, charset="ascii", collation="ascii_bin"), *MYSQL_NAMES)
    )


def Json() -> sa.types.TypeEngine[Any]:
    # JSONB on PostgreSQL: tags and metadata filters want its containment operators.
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


def Id() -> sa.types.TypeEngine[int]:
    # INTEGER on SQLite so the key is the rowid alias (BIGINT would not autoincrement).
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


# Every table: InnoDB, utf8mb4 with binary collation on MySQL/MariaDB.
TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}

# ---------------------------------------------------------------- API database

api_metadata = sa.MetaData()

cell_mappings = sa.Table(
    "cell_mappings",
    api_metadata,
    sa.Column("id", Id(), primary_key=True, autoincrement=True),
    sa.Column("uuid", Uuid(), nullable=False),
    sa.Column("name", Str(255), nullable=False),
    # Nova's column name; it may hold credentials, so it is masked in every message.
    sa.Column("database_connection", sa.Text(), nullable=False),
    sa.Column("disabled", sa.Boolean(), nullable=False, default=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=True),
    sa.Index("ux_cell_mappings_uuid", "uuid", unique=True),
    sa.Index("ux_cell_mappings_name", "name", unique=True),
    **TABLE_OPTIONS,
)

instance_mappings = sa.Table(
    "instance_mappings",
    api_metadata,
    sa.Column("id", Id(), primary_key=True, autoincrement=True),
    sa.Column("instance_uuid", Uuid(), nullable=False),
    sa.Column(
        "cell_uuid", Uuid(), sa.ForeignKey("cell_mappings.uuid", name="fk_im_cell"), nullable=True
    ),
    sa.Column("project_id", Str(255), nullable=False),
    sa.Column("user_id", Str(255), nullable=True),
    # Nova keeps the mapping of a deleted instance until archival, flagged like this.
    sa.Column("queued_for_delete", sa.Boolean(), nullable=False, default=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=True),
    sa.Index("ux_instance_mappings_instance_uuid", "instance_uuid", unique=True),
    sa.Index("ix_instance_mappings_project_id", "project_id"),
    sa.Index("ix_instance_mappings_cell_uuid", "cell_uuid"),
    **TABLE_OPTIONS,
)

# Cellsight's own records about the cluster, JSON by key: the purge floor, which both
# listing paths apply and the fan-out must know without the index.
api_meta = sa.Table(
    "cellsight_meta",
    api_metadata,
    sa.Column("key", Str(255), primary_key=True),
    sa.Column("value", sa.Text(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    **TABLE_OPTIONS,
)

# --------------------------------------------------------------- cell database

cell_metadata = sa.MetaData()

instances = sa.Table(
    "instances",
    cell_metadata,
    sa.Column("id", Id(), primary_key=True, autoincrement=True),
    sa.Column("uuid", Uuid(), nullable=False),
    sa.Column("user_id", Str(255)),
    sa.Column("project_id", Str(255)),  # payload: tenant_id
    sa.Column("reservation_id", Str(255)),
    sa.Column("display_name", Str(255)),
    sa.Column("display_description", sa.Text()),
    sa.Column("hostname", Str(255)),  # payload: host_name
    sa.Column("host", Str(255)),
    sa.Column("node", Str(255)),
    sa.Column("os_type", Str(255)),
    sa.Column("architecture", Str(255)),
    sa.Column("availability_zone", Str(255)),
    sa.Column("flavor", Json()),
    sa.Column("flavor_id", Str(255)),  # flavor.flavorid
    sa.Column("flavor_name", Str(255)),
    sa.Column("memory_mb", sa.Integer()),
    sa.Column("vcpus", sa.Integer()),
    sa.Column("root_gb", sa.Integer()),
    sa.Column("ephemeral_gb", sa.Integer()),
    sa.Column("image_ref", Str(255)),  # payload: image_uuid
    sa.Column("key_name", Str(255)),
    sa.Column("kernel_id", Str(255)),
    sa.Column("ramdisk_id", Str(255)),
    sa.Column("created_at", UTCDateTime()),
    sa.Column("updated_at", UTCDateTime()),
    sa.Column("launched_at", UTCDateTime()),
    sa.Column("terminated_at", UTCDateTime()),
    sa.Column("deleted_at", UTCDateTime()),
    sa.Column("vm_state", Str(255)),  # payload: state
    sa.Column("power_state", Str(255)),  # Nova's payload names ("running"), not its ints
    sa.Column("task_state", Str(255)),
    sa.Column("progress", sa.Integer()),
    sa.Column("ip_addresses", Json()),
    sa.Column("block_devices", Json()),
    sa.Column("metadata", Json()),
    sa.Column("auto_disk_config", Str(32)),
    sa.Column("locked", sa.Boolean(), nullable=False, default=False),
    sa.Column("locked_reason", Str(255)),
    sa.Column("request_id", Str(255)),
    sa.Column("action_initiator_project", Str(255)),
    sa.Column("action_initiator_user", Str(255)),
    sa.Column("shares", Json()),
    # InstanceCreatePayload / InstanceUpdatePayload fields kept with the instance.
    sa.Column("tags", Json()),
    sa.Column("keypairs", Json()),
    sa.Column("trusted_image_certificates", Json()),
    sa.Column("instance_name", Str(255)),
    # Cellsight's extensions.
    sa.Column("forthcoming", sa.Boolean(), nullable=False, default=False),
    sa.Column("revision", sa.BigInteger(), nullable=False, default=1),
    sa.Column("deleted", sa.Boolean(), nullable=False, default=False),
    # Keyset paging orders by (sort key, uuid), hence uuid after the sort key. Each index
    # costs every insert and a seed's build time, so only the default sort, the common
    # sorts and the common filters have one; rarer sort keys (launched_at, power_state,
    # …) sort the rows left after filtering, a bounded top-N sort per cell.
    sa.Index("ux_instances_uuid", "uuid", unique=True),
    sa.Index("ix_instances_created_at", "created_at", "uuid"),
    sa.Index("ix_instances_deleted_created_at", "deleted", "created_at", "uuid"),
    sa.Index("ix_instances_updated_at", "updated_at", "uuid"),
    sa.Index("ix_instances_display_name", "display_name", "uuid"),
    sa.Index("ix_instances_project_deleted", "project_id", "deleted", "created_at"),
    sa.Index("ix_instances_user_id", "user_id"),
    sa.Index("ix_instances_host_node", "host", "node"),
    sa.Index("ix_instances_vm_state", "vm_state", "task_state"),
    **TABLE_OPTIONS,
)

compute_nodes = sa.Table(
    "compute_nodes",
    cell_metadata,
    sa.Column("id", Id(), primary_key=True, autoincrement=True),
    sa.Column("uuid", Uuid(), nullable=False),
    sa.Column("host", Str(255), nullable=False),
    sa.Column("hypervisor_hostname", Str(255), nullable=False),
    sa.Column("availability_zone", Str(255)),
    sa.Column("memory_mb", sa.Integer(), nullable=False, default=0),
    sa.Column("memory_mb_used", sa.Integer(), nullable=False, default=0),
    sa.Column("vcpus", sa.Integer(), nullable=False, default=0),
    sa.Column("vcpus_used", sa.Integer(), nullable=False, default=0),
    sa.Column("local_gb", sa.Integer(), nullable=False, default=0),
    sa.Column("local_gb_used", sa.Integer(), nullable=False, default=0),
    sa.Column("cpu_allocation_ratio", sa.Float(), nullable=False, default=4.0),
    sa.Column("ram_allocation_ratio", sa.Float(), nullable=False, default=1.0),
    sa.Column("disk_allocation_ratio", sa.Float(), nullable=False, default=1.0),
    # Held for forthcoming (reserved, not yet built) instances; counted as used.
    sa.Column("forthcoming_reservations", sa.Integer(), nullable=False, default=0),
    sa.Column("disabled", sa.Boolean(), nullable=False, default=False),
    sa.Column("offline", sa.Boolean(), nullable=False, default=False),
    sa.Column("created_at", UTCDateTime()),
    sa.Column("updated_at", UTCDateTime()),
    sa.Column("revision", sa.BigInteger(), nullable=False, default=1),
    sa.Column("deleted", sa.Boolean(), nullable=False, default=False),
    sa.Index("ux_compute_nodes_uuid", "uuid", unique=True),
    sa.Index("ux_compute_nodes_host_node", "host", "hypervisor_hostname", unique=True),
    **TABLE_OPTIONS,
)

# The transactional outbox (``cellsight.cells.outbox``): notifications written in the same
# transaction as the change they describe, published and deleted after commit.
outbox = sa.Table(
    "outbox",
    cell_metadata,
    # Publication order: ids grow with commit order within one cell.
    sa.Column("id", Id(), primary_key=True, autoincrement=True),
    sa.Column("instance_uuid", Uuid()),
    sa.Column("event_type", Str(255), nullable=False),
    sa.Column("body", sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL_NAMES), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    **TABLE_OPTIONS,
)

# One row per cell: which relay may publish the outbox now, and until when.
outbox_lease = sa.Table(
    "outbox_lease",
    cell_metadata,
    sa.Column("name", Str(64), primary_key=True),
    sa.Column("holder", Str(128)),
    sa.Column("expires_at", UTCDateTime()),
    **TABLE_OPTIONS,
)

# Which cell a database was registered as (key ``cell_uuid``): two URLs can name one
# database (``localhost`` and ``127.0.0.1``, a port written out or not, another user),
# and two cells on one database list each of its instances twice.
cell_meta = sa.Table(
    "cell_meta",
    cell_metadata,
    sa.Column("key", Str(64), primary_key=True),
    sa.Column("value", Str(255), nullable=False),
    **TABLE_OPTIONS,
)


def create_api_schema(engine: sa.Engine) -> None:
    _create_missing(engine, api_metadata, api_metadata.create_all)


def create_cell_schema(engine: sa.Engine, *, indexes: bool = True) -> None:
    """Create the cell tables; ``indexes=False`` defers the indexes for a bulk load."""

    def tables_only(conn: sa.Connection) -> None:
        for table in cell_metadata.sorted_tables:
            if not sa.inspect(conn).has_table(table.name):
                conn.execute(sa.schema.CreateTable(table))

    _create_missing(engine, cell_metadata, cell_metadata.create_all if indexes else tables_only)


def _create_missing(
    engine: sa.Engine, metadata: sa.MetaData, create: Callable[[sa.Connection], None]
) -> None:
    """Every command opens the API database this way: with its tables all there, it only
    looks (no lock, beside writers). Otherwise they are made in one transaction, on
    SQLite with the write lock taken first: commands run at once on a new data
    directory each looked for the tables and then created them, and SQLite failed the
    later ones at once ("database is locked") rather than wait. Driver errors stay what
    they are (a denied CREATE is not the database being down)."""
    with engine.connect() as conn:
        present = set(sa.inspect(conn).get_table_names())
        conn.rollback()
        if present.issuperset(metadata.tables):
            return
        with conn.execution_options(sqlite_begin="IMMEDIATE").begin():
            create(conn)


def create_cell_indexes(bind: sa.Engine | sa.Connection) -> None:
    """Create any missing index of the cell tables (after a bulk load)."""
    if isinstance(bind, sa.Engine):
        with bind.begin() as conn:
            _create_indexes(conn)
    else:
        with bind.begin():
            _create_indexes(bind)


def _create_indexes(conn: sa.Connection) -> None:
    inspector = sa.inspect(conn)
    for table in cell_metadata.sorted_tables:
        existing = {ix["name"] for ix in inspector.get_indexes(table.name)}
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            if index.name not in existing:
                index.create(conn)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _memoize_type_keys(*metadatas: sa.MetaData) -> None:
    """SQLAlchemy memoizes a column type's cache key on the type the first time a
    statement naming it is compiled; two threads doing that at once for one type crashed
    the process (SIGSEGV inside its cache-key code: a demo's sync, whose reader threads
    read two cells at once, in CI and in about 1 run in 50 here). Computed once, here, at
    import, in one thread. A SQLAlchemy without the attribute skips it."""
    for metadata in metadatas:
        for table in metadata.tables.values():
            for column in table.columns:
                getattr(column.type, "_static_cache_key", None)


_memoize_type_keys(api_metadata, cell_metadata)
