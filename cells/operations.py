"""Cluster operations: one cell transaction each, notifications only after commit.

Every change bumps the instance's ``revision`` and sets ``updated_at``; the UPDATE is
guarded by the revision read under ``SELECT … FOR UPDATE`` (SQLite: ``BEGIN
IMMEDIATE``), so a lost race raises ``ConcurrentUpdate`` instead of overwriting. The
events (``events.py``) are built from the committed rows and published after the
commit through the injected ``Publisher``; an operation that raises inside its
transaction rolls back and publishes nothing. A publish failure after the commit
propagates (the change stays committed; the index's anti-entropy check repairs it).

Boot writes two databases. The instance mapping (API database) is written first,
then the instance rows (cell database). If the cell transaction fails, the mapping is
deleted again; if that clean-up fails too, a mapping to a missing row remains, which
readers treat as "not found" and anti-entropy removes. The reverse order could leave
an instance row that no lookup by uuid can find.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cells.actions import (
    ANY_STATE,
    DELETE,
    LIVE_MIGRATE,
    LOCK,
    POWER_OFF,
    POWER_ON,
    REBOOT,
    REBOOT_HARD,
    RENAME,
    RESIZE,
    SET_TAGS,
    UNLOCK,
    UPDATE_METADATA,
    Action,
)
from cells.database import write_transaction
from cells.errors import (
    ConcurrentUpdate,
    DuplicateInstance,
    InstanceLocked,
    InstanceNotFound,
    InvalidInstanceState,
    NoValidHost,
)
from cells.events import action_events, create_events
from cells.flavors import get_flavor
from cells.instances import ADMIN, Actor, BootRequest, new_instance_row
from cells.mappings import CellMapping, CellRegistry
from cells.reads import get_instance
from cells.rows import InstanceRow, action_payload, create_payload, flavor_columns
from cells.scheduler import Resources, Scheduler, claim, release
from cells.schema import compute_nodes, instances, utcnow
from notifications.envelope import Notification
from notifications.objects import Selection
from notifications.payloads import InstanceActionPayload, InstanceCreatePayload
from notifications.publisher import Publisher

log = logging.getLogger(__name__)

BeforeCommit = Callable[[str, sa.Connection], None]
"""Called inside each transaction just before commit with the action name; raising
rolls the operation back (tests use it to fail an operation for real)."""


@dataclass
class BootResult:
    cell: CellMapping
    selections: list[list[Selection]]
    instances: list[InstanceCreatePayload] = field(default_factory=list)


Mutation = Callable[[sa.Connection, InstanceRow], dict[str, Any]]


class Operations:
    def __init__(
        self,
        registry: CellRegistry,
        publisher: Publisher,
        *,
        publisher_id: str = "cellsight-ops",
        scheduler: Scheduler | None = None,
        before_commit: BeforeCommit | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.registry = registry
        self.publisher = publisher
        self.publisher_id = publisher_id
        self.scheduler = scheduler or Scheduler(registry)
        self.before_commit = before_commit
        self.clock = clock

    # ------------------------------------------------------------------ boot

    def boot(self, request: BootRequest, actor: Actor = ADMIN) -> BootResult:
        flavor = get_flavor(request.flavor)
        uuids = request.instance_uuids()
        selections = self.scheduler.select_destinations(
            flavor,
            count=request.count,
            cell=request.cell,
            availability_zone=request.availability_zone,
        )
        cell = self.registry.get_cell(selections[0][0].cell_uuid)
        try:
            self.registry.map_instances(
                cell.uuid, [(u, request.project_id, request.user_id) for u in uuids]
            )
        except sa.exc.IntegrityError:
            taken = next((u for u in uuids if self._mapped(u)), uuids[0])
            raise DuplicateInstance(taken) from None
        try:
            rows = self._boot_rows(cell, request, flavor, uuids, selections, actor)
        except BaseException:
            try:
                self.registry.unmap_instances(uuids)
            except Exception:
                log.exception(
                    "boot of %s failed and its mappings could not be removed", ", ".join(uuids)
                )
            raise
        now = self.clock()
        self._publish(
            [e for row in rows for e in create_events(row, cell.uuid, self.publisher_id, now)]
        )
        return BootResult(cell, selections, [create_payload(row, cell.uuid) for row in rows])

    def _mapped(self, instance_uuid: str) -> bool:
        try:
            self.registry.get_instance_mapping(instance_uuid)
        except InstanceNotFound:
            return False
        return True

    def _boot_rows(
        self,
        cell: CellMapping,
        request: BootRequest,
        flavor: dict[str, Any],
        uuids: list[str],
        selections: list[list[Selection]],
        actor: Actor,
    ) -> list[InstanceRow]:
        want = Resources.of_flavor(flavor)
        now = self.clock()
        with write_transaction(self.registry.cell_engine(cell)) as conn:
            for index, (uuid, choices) in enumerate(zip(uuids, selections, strict=True)):
                chosen = next((s for s in choices if claim(conn, s.compute_node_uuid, want)), None)
                if chosen is None:
                    raise NoValidHost(f"every host picked for {uuid} filled up meanwhile")
                row = new_instance_row(request, flavor, uuid, index, chosen, actor, now)
                try:
                    conn.execute(instances.insert().values(**row))
                except sa.exc.IntegrityError:
                    raise DuplicateInstance(uuid) from None
            if self.before_commit is not None:
                self.before_commit("create", conn)
            rows = [get_instance(conn, u) for u in uuids]
        return [r for r in rows if r is not None]

    # -------------------------------------------------------------- actions

    def rename(self, uuid: str, display_name: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        return self._act(uuid, RENAME, actor, lambda conn, row: {"display_name": display_name})

    def update_metadata(
        self,
        uuid: str,
        set_items: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        actor: Actor = ADMIN,
    ) -> InstanceActionPayload:
        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            metadata = {**(row["metadata"] or {}), **(set_items or {})}
            for key in remove:
                metadata.pop(key, None)
            return {"metadata": metadata}

        return self._act(uuid, UPDATE_METADATA, actor, change)

    def set_tags(
        self, uuid: str, tags: Iterable[str], actor: Actor = ADMIN
    ) -> InstanceActionPayload:
        return self._act(uuid, SET_TAGS, actor, lambda c, r: {"tags": sorted(set(tags))})

    def power_off(self, uuid: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        return self._act(
            uuid,
            POWER_OFF,
            actor,
            lambda c, r: {"vm_state": "stopped", "power_state": "shutdown", "task_state": None},
        )

    def power_on(self, uuid: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        return self._act(
            uuid,
            POWER_ON,
            actor,
            lambda c, r: {"vm_state": "active", "power_state": "running", "task_state": None},
        )

    def reboot(
        self, uuid: str, *, hard: bool = False, actor: Actor = ADMIN
    ) -> InstanceActionPayload:
        return self._act(
            uuid,
            REBOOT_HARD if hard else REBOOT,
            actor,
            lambda c, r: {"vm_state": "active", "power_state": "running", "task_state": None},
        )

    def resize(self, uuid: str, flavor_name: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        """Change the flavor on the same host (resize confirmed at once)."""
        new = get_flavor(flavor_name)

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            old = row["flavor"] or {}
            if old.get("flavorid") == new["flavorid"]:
                raise InvalidInstanceState(
                    uuid, f"resize to the same flavor {new['name']}", row["vm_state"], set()
                )
            delta = Resources.of_flavor(new) - Resources.of_flavor(old)
            node = self._node_uuid(conn, row["host"], row["node"])
            if node is None or not claim(conn, node, delta):
                raise NoValidHost(
                    f"host {row['host']!r} has no room to resize {uuid} to {new['name']}"
                )
            return {"flavor": new, **flavor_columns(new), "task_state": None}

        return self._act(uuid, RESIZE, actor, change)

    def live_migrate(
        self, uuid: str, host: str | None = None, actor: Actor = ADMIN
    ) -> InstanceActionPayload:
        """Move to ``host`` (or the scheduler's pick) in the same cell."""

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            if host is not None and host == row["host"]:
                raise InvalidInstanceState(
                    uuid, f"live-migrate to its own host {host}", row["vm_state"], set()
                )
            want = Resources.of_flavor(row["flavor"] or {})
            for node in self._destinations(conn, row, host):
                if claim(conn, node["uuid"], want):
                    release(conn, row["host"], row["node"], want)
                    return {
                        "host": node["host"],
                        "node": node["hypervisor_hostname"],
                        "availability_zone": node["availability_zone"],
                        "task_state": None,
                    }
            raise NoValidHost(
                f"no host in this cell has room to live-migrate {uuid}"
                + (f" to {host!r}" if host else "")
            )

        return self._act(uuid, LIVE_MIGRATE, actor, change)

    def lock(
        self, uuid: str, reason: str | None = None, actor: Actor = ADMIN
    ) -> InstanceActionPayload:
        return self._act(uuid, LOCK, actor, lambda c, r: {"locked": True, "locked_reason": reason})

    def unlock(self, uuid: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        return self._act(uuid, UNLOCK, actor, lambda c, r: {"locked": False, "locked_reason": None})

    def delete(self, uuid: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        """Soft delete: the row stays with ``deleted``, ``deleted_at`` and state 'deleted'."""

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            release(conn, row["host"], row["node"], Resources.of_flavor(row["flavor"] or {}))
            now = self.clock()
            return {
                "vm_state": "deleted",
                "power_state": "pending",
                "task_state": None,
                "deleted": True,
                "deleted_at": now,
                "terminated_at": now,
            }

        cell, before, after = self._commit(uuid, DELETE, actor, change)
        try:
            self.registry.queue_for_delete(uuid)
        except Exception:
            # The cell row is the truth; the flag only schedules the mapping's archival.
            log.exception("instance %s deleted but its mapping was not flagged", uuid)
        return self._notify(DELETE, cell, before, after)

    # ------------------------------------------------------------ machinery

    def _act(
        self, uuid: str, action: Action, actor: Actor, mutate: Mutation
    ) -> InstanceActionPayload:
        return self._notify(action, *self._commit(uuid, action, actor, mutate))

    def _commit(
        self, uuid: str, action: Action, actor: Actor, mutate: Mutation
    ) -> tuple[CellMapping, InstanceRow, InstanceRow]:
        cell = self.registry.locate(uuid)
        with write_transaction(self.registry.cell_engine(cell)) as conn:
            before = get_instance(conn, uuid, for_update=True)
            if before is None or not actor.may_see(before):
                raise InstanceNotFound(uuid, f"cell {cell.name}")
            self._check(before, action, actor)
            changes = mutate(conn, before)
            changes.update(
                revision=before["revision"] + 1,
                updated_at=self.clock(),
                request_id=actor.request_id or f"req-{uuidlib.uuid4()}",
                action_initiator_project=actor.project_id or before["project_id"],
                action_initiator_user=actor.user_id or before["user_id"],
            )
            done = conn.execute(
                instances.update()
                .where(instances.c.id == before["id"], instances.c.revision == before["revision"])
                .values(**changes)
            )
            if done.rowcount != 1:
                raise ConcurrentUpdate(uuid)
            if self.before_commit is not None:
                self.before_commit(action.name, conn)
            after = get_instance(conn, uuid)
        assert after is not None
        return cell, before, after

    def _check(self, row: InstanceRow, action: Action, actor: Actor) -> None:
        allowed = action.allowed or ANY_STATE
        if row["deleted"] or row["vm_state"] not in allowed:
            raise InvalidInstanceState(
                row["uuid"], action.describe(), row["vm_state"], set(allowed)
            )
        if row["locked"] and not actor.is_admin and not action.lock_exempt:
            raise InstanceLocked(row["uuid"], action.describe(), row["locked_reason"])

    def _notify(
        self, action: Action, cell: CellMapping, before: InstanceRow, after: InstanceRow
    ) -> InstanceActionPayload:
        self._publish(
            action_events(action, before, after, cell.uuid, self.publisher_id, self.clock())
        )
        return action_payload(after, cell.uuid)

    def _publish(self, events: list[Notification]) -> None:
        if events:
            self.publisher.publish_many(events)

    @staticmethod
    def _node_uuid(conn: sa.Connection, host: str | None, node: str | None) -> str | None:
        c = compute_nodes.c
        query = sa.select(c.uuid).where(c.host == host, c.deleted.is_(False))
        if node is not None:
            query = query.where(c.hypervisor_hostname == node)
        value = conn.execute(query).scalar()
        return None if value is None else str(value)

    def _destinations(
        self, conn: sa.Connection, row: InstanceRow, host: str | None
    ) -> list[dict[str, Any]]:
        c = compute_nodes.c
        query = sa.select(compute_nodes).where(
            c.deleted.is_(False), c.disabled.is_(False), c.offline.is_(False), c.host != row["host"]
        )
        if host is not None:
            nodes = [dict(r) for r in conn.execute(query.where(c.host == host)).mappings()]
            if not nodes:
                raise NoValidHost(f"{host!r} is not an enabled compute host of this cell")
            return nodes
        # Most free memory first, Nova's default weigher.
        free = c.memory_mb * c.ram_allocation_ratio - c.memory_mb_used
        return [dict(r) for r in conn.execute(query.order_by(free.desc(), c.host)).mappings()]
