"""The API database: the cells registry and the instance mappings.

``CellRegistry`` is the one object the operations, the seeder and (later) the API
receive: it owns the API engine and the cache of cell engines.
"""

from __future__ import annotations

import json
import logging
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from cellsight.cells.cell_names import (
    hold_registration_lock,
    prepare_registration_lock,
    refuse_taken,
)
from cellsight.cells.database import (
    Engines,
    connect,
    create_database,
    parse_url,
    write_transaction,
)
from cellsight.cells.errors import (
    BadDatabaseURL,
    DatabaseUnavailable,
    DriverRefusedURL,
    InstanceNotFound,
    NoValidHost,
    UnknownCell,
    safe_url,
)
from cellsight.cells.identity import holder, mark
from cellsight.cells.schema import (
    api_meta,
    cell_mappings,
    create_api_schema,
    create_cell_schema,
    instance_mappings,
    utcnow,
)
from cellsight.cells.text_rules import check_name

if TYPE_CHECKING:
    from cellsight.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CellMapping:
    uuid: str
    name: str
    database_url: str
    disabled: bool = False
    created_at: datetime | None = None

    @property
    def safe_url(self) -> str:
        return safe_url(self.database_url)


@dataclass(frozen=True)
class InstanceMapping:
    instance_uuid: str
    cell_uuid: str | None
    project_id: str
    user_id: str | None
    queued_for_delete: bool
    created_at: datetime | None = None


def _cell(row: sa.RowMapping) -> CellMapping:
    return CellMapping(
        uuid=row["uuid"],
        name=row["name"],
        database_url=row["database_connection"],
        disabled=bool(row["disabled"]),
        created_at=row["created_at"],
    )


def _instance_mapping(row: sa.RowMapping) -> InstanceMapping:
    return InstanceMapping(
        instance_uuid=row["instance_uuid"],
        cell_uuid=row["cell_uuid"],
        project_id=row["project_id"],
        user_id=row["user_id"],
        queued_for_delete=bool(row["queued_for_delete"]),
        created_at=row["created_at"],
    )


class CellRegistry:
    """Cells and instance mappings in the API database, and each cell's engine."""

    def __init__(self, api_url: str, engines: Engines | None = None) -> None:
        self.engines = engines or Engines()
        self.api_url = api_url
        # The longest a boot's statements may take (``db_statement_timeout``), where the
        # process's own bound is another (the API's is ``cell_timeout``): ``leftovers``.
        self.build_timeout: float | None = None
        # The API database is made on first use (its tables by create_schema); a cell's
        # only by add_cell or the seeder: cell_engine opens existing ones only.
        create_database(api_url, connect_timeout=self.engines.timeouts.connect)
        self.api_engine = self.engines.get(api_url)

    @classmethod
    def from_settings(cls, settings: Settings, *, create: bool = True) -> CellRegistry:
        engines = Engines(
            connect_timeout=settings.db_connect_timeout,
            statement_timeout=settings.db_statement_timeout,
            lock_timeout=settings.db_lock_timeout,
        )
        registry = cls(settings.resolved_api_db_url, engines)
        registry.build_timeout = settings.db_statement_timeout
        if create:
            registry.create_schema()
        return registry

    def create_schema(self) -> None:
        with connect(self.api_engine):
            pass  # a clear DatabaseUnavailable before DDL, rather than a DDL error
        create_api_schema(self.api_engine)

    def close(self) -> None:
        self.engines.dispose()

    # ------------------------------------------------------------------ cells

    def add_cell(
        self, name: str, database_url: str, *, uuid: str | None = None, create_schema: bool = True
    ) -> CellMapping:
        """Register a cell; its database is checked (and, with ``create_schema``, a
        missing SQLite file and its tables created) first."""
        check_name("cell name", name)
        parsed = parse_url(database_url)
        url = parsed.render_as_string(hide_password=False)
        cell_uuid = str(uuidlib.UUID(uuid)) if uuid else str(uuidlib.uuid4())
        with connect(self.api_engine) as conn:
            # First, so a taken name creates no database; checked again when written.
            refuse_taken(conn, name, cell_uuid, url)
        if create_schema:
            create_database(parsed, connect_timeout=self.engines.timeouts.connect)
        engine = self.engines.get(url)
        try:
            with connect(engine):
                pass
        except DriverRefusedURL as exc:  # the URL just given: the operator's to fix
            raise BadDatabaseURL(url, exc.why) from None
        if create_schema:
            create_cell_schema(engine)
        taken_by = holder(engine, self.api_engine, self.engines.get)
        prepare_registration_lock(self.api_engine)
        with write_transaction(self.api_engine) as conn:
            hold_registration_lock(conn)
            refuse_taken(conn, name, cell_uuid, url, taken_by)
            now = utcnow()
            conn.execute(
                cell_mappings.insert().values(
                    uuid=cell_uuid,
                    name=name,
                    database_connection=url,
                    disabled=False,
                    created_at=now,
                    updated_at=now,
                )
            )
        try:
            mark(engine, cell_uuid)
        except BaseException:
            # Not registered after all (an operator probe: a user without write grants
            # on the cell got an error, and the cell stayed listed, its name taken).
            self.unregister(cell_uuid, name)
            raise
        return CellMapping(cell_uuid, name, url, False, now)

    def unregister(self, cell_uuid: str, name: str) -> None:
        # By both: never a cell another command registered meanwhile under that uuid.
        mapping = (cell_mappings.c.uuid == cell_uuid) & (cell_mappings.c.name == name)
        try:
            with write_transaction(self.api_engine) as conn:
                conn.execute(cell_mappings.delete().where(mapping))
        except Exception:
            log.exception("cell %r stays registered: `cells disable`, `cells remove "
                          "--skip-database-check` undo it", name)  # fmt: skip

    def list_cells(self, *, include_disabled: bool = True) -> list[CellMapping]:
        query = sa.select(cell_mappings).order_by(cell_mappings.c.name)
        if not include_disabled:
            query = query.where(cell_mappings.c.disabled.is_(False))
        with connect(self.api_engine) as conn:
            return [_cell(row) for row in conn.execute(query).mappings()]

    def get_cell(self, ref: str) -> CellMapping:
        """A cell by uuid or name; ``UnknownCell`` names the known ones otherwise."""
        query = sa.select(cell_mappings).where(
            sa.or_(cell_mappings.c.uuid == ref.lower(), cell_mappings.c.name == ref)
        )
        with connect(self.api_engine) as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            raise UnknownCell(ref, [c.name for c in self.list_cells()])
        return _cell(row)

    def set_disabled(self, ref: str, disabled: bool) -> CellMapping:
        """A disabled cell takes no new instances (the scheduler and reservations skip
        it); its instances are listed, changed and deleted as before, as in Nova."""
        cell = self.get_cell(ref)
        with write_transaction(self.api_engine) as conn:
            conn.execute(
                cell_mappings.update()
                .where(cell_mappings.c.uuid == cell.uuid)
                .values(disabled=disabled, updated_at=utcnow())
            )
        return self.get_cell(cell.uuid)

    def placeable_cells(self, ref: str | None = None) -> list[CellMapping]:
        """Where a new instance may go: the cell named (``NoValidHost`` if it is disabled,
        as Nova's host manager leaves a disabled cell's hosts out even for a forced host),
        or every enabled cell."""
        if ref is None:
            return self.list_cells(include_disabled=False)
        cell = self.get_cell(ref)
        if cell.disabled:
            raise NoValidHost(f"cell {cell.name!r} is disabled")
        return [cell]

    def cell_engine(self, cell: CellMapping | str) -> sa.Engine:
        """The cell's engine; it opens an existing database only (a missing SQLite file
        is ``DatabaseMissing`` on connect, never a new empty cell)."""
        if isinstance(cell, str):
            cell = self.get_cell(cell)
        return cell_engine(self.engines, cell)

    # ------------------------------------------------------ instance mappings

    def map_instances(
        self,
        cell_uuid: str,
        mappings: Sequence[tuple[str, str, str | None]],
        conn: sa.Connection | None = None,
    ) -> None:
        """Insert mappings ``(instance_uuid, project_id, user_id)`` to one cell."""
        if not mappings:
            return
        now = utcnow()
        rows: list[dict[str, Any]] = [
            {
                "instance_uuid": i,
                "cell_uuid": cell_uuid,
                "project_id": p,
                "user_id": u,
                "queued_for_delete": False,
                "created_at": now,
                "updated_at": now,
            }
            for i, p, u in mappings
        ]
        if conn is not None:
            conn.execute(instance_mappings.insert(), rows)
            return
        with write_transaction(self.api_engine) as own:
            own.execute(instance_mappings.insert(), rows)

    def place_instances(
        self, cell_uuid: str, mappings: Sequence[tuple[str, str, str | None]]
    ) -> None:
        """``map_instances`` for new instances: in the same transaction, the cell's row is
        read under a shared lock and must still be there and enabled, so a placement
        chosen before ``cells disable`` or ``cells remove`` cannot land after it
        (``NoValidHost``). A uuid already mapped raises ``IntegrityError``."""
        with write_transaction(self.api_engine) as conn:
            row = (
                conn.execute(
                    sa.select(cell_mappings.c.name, cell_mappings.c.disabled)
                    .where(cell_mappings.c.uuid == cell_uuid)
                    .with_for_update(read=True)
                )
                .mappings()
                .first()
            )
            if row is None:
                raise NoValidHost(f"cell {cell_uuid} was removed")
            if row["disabled"]:
                raise NoValidHost(f"cell {row['name']!r} is disabled")
            self.map_instances(cell_uuid, mappings, conn)

    def unmap_instances(self, instance_uuids: Sequence[str]) -> None:
        with write_transaction(self.api_engine) as conn:
            conn.execute(
                instance_mappings.delete().where(
                    instance_mappings.c.instance_uuid.in_(list(instance_uuids))
                )
            )

    def queue_for_delete(self, instance_uuid: str) -> None:
        with write_transaction(self.api_engine) as conn:
            conn.execute(
                instance_mappings.update()
                .where(instance_mappings.c.instance_uuid == instance_uuid)
                .values(queued_for_delete=True, updated_at=utcnow())
            )

    def get_instance_mapping(self, instance_uuid: str) -> InstanceMapping:
        if not instance_uuid.isascii():
            # No stored uuid is, and MariaDB's ascii uuid column refuses the comparison.
            raise InstanceNotFound(instance_uuid, "the instance mappings")
        query = sa.select(instance_mappings).where(
            instance_mappings.c.instance_uuid == instance_uuid
        )
        with connect(self.api_engine) as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            raise InstanceNotFound(instance_uuid, "the instance mappings")
        return _instance_mapping(row)

    def find_instance_mapping(self, instance_uuid: str) -> InstanceMapping:
        """``get_instance_mapping``, then, for an id in another case, that of the id as
        Nova writes uuids (lower case): Nova finds such an id through MySQL's
        case-insensitive collation, and the API and the CLI read uuids in any case."""
        try:
            return self.get_instance_mapping(instance_uuid)
        except InstanceNotFound:
            lowered = instance_uuid.lower()
            if lowered == instance_uuid:
                raise
            return self.get_instance_mapping(lowered)

    def locate(self, instance_uuid: str) -> CellMapping:
        """The cell holding an instance, from its mapping."""
        mapping = self.get_instance_mapping(instance_uuid)
        if mapping.cell_uuid is None:
            raise InstanceNotFound(instance_uuid, "any cell (not yet scheduled)")
        return self.get_cell(mapping.cell_uuid)

    def cells_of(self, instance_uuids: Sequence[str]) -> dict[str, str]:
        """Instance uuid → cell uuid for the mapped ones (one query per 500 uuids)."""
        found: dict[str, str] = {}
        m = instance_mappings.c
        with connect(self.api_engine) as conn:
            for start in range(0, len(instance_uuids), 500):
                chunk = list(instance_uuids[start : start + 500])
                rows = conn.execute(
                    sa.select(m.instance_uuid, m.cell_uuid).where(
                        m.instance_uuid.in_(chunk), m.cell_uuid.is_not(None)
                    )
                )
                found.update({r.instance_uuid: r.cell_uuid for r in rows})
        return found

    def purged_before(self, instance_uuids: Sequence[str], floor: datetime) -> set[str]:
        """Those a purge at ``floor`` may have removed from the index (``cells.purged``)."""
        from cellsight.cells.purged import purged_before

        return purged_before(self, instance_uuids, floor)

    def count_mappings(self, cell_uuid: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(instance_mappings)
        if cell_uuid is not None:
            query = query.where(instance_mappings.c.cell_uuid == cell_uuid)
        with connect(self.api_engine) as conn:
            return int(conn.execute(query).scalar_one())

    # ------------------------------------------------------------- records

    def get_meta(self, key: str) -> Any:
        """The record's JSON value (None: no record); ``ValueError`` for one that is not
        JSON (written by hand): what it must hold is the reader's to check."""
        with connect(self.api_engine) as conn:
            value = conn.execute(
                sa.select(api_meta.c.value).where(api_meta.c.key == key)
            ).scalar_one_or_none()
        return None if value is None else json.loads(value)

    def put_meta(self, key: str, value: dict[str, Any]) -> None:
        with write_transaction(self.api_engine) as conn:
            conn.execute(api_meta.delete().where(api_meta.c.key == key))
            conn.execute(
                api_meta.insert().values(key=key, value=json.dumps(value), updated_at=utcnow())
            )


def cell_engine(engines: Engines, cell: CellMapping) -> sa.Engine:
    """``cell``'s engine from ``engines``. A registered cell whose stored URL became
    unusable (edited by hand) is down, as an unreachable one is (``DatabaseUnavailable``):
    skipped and named, where it ended every command that reads the cells."""
    try:
        return engines.get(cell.database_url)
    except BadDatabaseURL as exc:
        raise DatabaseUnavailable(
            cell.database_url, f"cell {cell.name}'s URL is not usable: {exc.why}"
        ) from None
