"""Cluster operations: one cell transaction each, its notifications in the same one.

Every change bumps the instance's ``revision`` and sets ``updated_at``; the UPDATE is
guarded by the revision read under ``SELECT … FOR UPDATE`` (SQLite: ``BEGIN
IMMEDIATE``), so a lost race raises ``ConcurrentUpdate`` instead of overwriting. The
events (``events.py``) are built from the changed rows and written to the cell's
outbox (``cellsight.cells.outbox``) in the same transaction; after the commit they are published
through the injected ``Publisher`` and deleted. An operation that raises inside its
transaction rolls back and publishes nothing, but a deadlock's victim runs again
(``retry_conflicts``). A publish failure after the commit does not fail the operation:
the notifications wait in the outbox for the relay.

Boots, which also write the API database, are ``cellsight.cells.boots``.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cellsight.cells import boots, outbox
from cellsight.cells.actions import (
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
from cellsight.cells.boots import BootResult
from cellsight.cells.database import retry_conflicts, write_transaction
from cellsight.cells.errors import (
    BlankText,
    CellUnavailable,
    ConcurrentUpdate,
    DatabaseUnavailable,
    InstanceLocked,
    InstanceNotFound,
    InvalidInstanceState,
    NoValidHost,
)
from cellsight.cells.events import action_events
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import ADMIN, Actor, BootRequest, check_tags
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.node_locks import lock_ids, node_ids
from cellsight.cells.nodeevents import USAGE_ACTIONS, node_events, places_of, read_nodes
from cellsight.cells.nodes import migration_destinations, node_uuid
from cellsight.cells.outbox import Outbox
from cellsight.cells.reads import get_instance
from cellsight.cells.rows import InstanceRow, action_payload, flavor_columns
from cellsight.cells.scheduler import (
    DEFAULT_AVAILABILITY_ZONE,
    Resources,
    Scheduler,
    claim,
    release,
)
from cellsight.cells.schema import compute_nodes, instances, utcnow
from cellsight.cells.text_rules import check_length, check_name
from cellsight.notifications.payloads import InstanceActionPayload
from cellsight.notifications.publisher import Publisher

log = logging.getLogger(__name__)

BeforeCommit = Callable[[str, sa.Connection], None]
"""Called inside each transaction just before commit with the action name; raising
rolls the operation back (tests use it to fail an operation for real)."""


Mutation = Callable[[sa.Connection, InstanceRow], dict[str, Any]]


class Operations:
    def __init__(
        self,
        registry: CellRegistry,
        publisher: Publisher,
        *,
        publisher_id: str = "cellsight-ops",
        scheduler: Scheduler | None = None,
        default_availability_zone: str | None = DEFAULT_AVAILABILITY_ZONE,
        before_commit: BeforeCommit | None = None,
        clock: Callable[[], datetime] = utcnow,
        relay: Outbox | None = None,
    ) -> None:
        self.registry = registry
        self.publisher = publisher
        self.relay = relay or Outbox(publisher)
        self._outbox_ready: set[str] = set()
        self.publisher_id = publisher_id
        self.scheduler = scheduler or Scheduler(
            registry, default_availability_zone=default_availability_zone
        )
        self.before_commit = before_commit
        self.clock = clock

    # ------------------------------------------------------------------ boot

    def boot(self, request: BootRequest, actor: Actor = ADMIN) -> BootResult:
        """Mapped, claimed and inserted; in a tight cell with reservations moved to make
        room (``cellsight.cells.boots``)."""
        return boots.boot(self, request, actor)

    # -------------------------------------------------------------- actions

    def rename(self, uuid: str, display_name: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        check_name("name", display_name)
        return self._act(uuid, RENAME, actor, lambda conn, row: {"display_name": display_name})

    def update_metadata(
        self,
        uuid: str,
        set_items: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        actor: Actor = ADMIN,
    ) -> InstanceActionPayload:
        for key, value in (set_items or {}).items():
            check_length("metadata key", key)
            check_length(f"metadata value of {key!r}", value)

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            metadata = {**(row["metadata"] or {}), **(set_items or {})}
            for key in remove:
                metadata.pop(key, None)
            return {"metadata": metadata}

        return self._act(uuid, UPDATE_METADATA, actor, change)

    def set_tags(
        self, uuid: str, tags: Iterable[str], actor: Actor = ADMIN
    ) -> InstanceActionPayload:
        unique = check_tags(list(tags))
        return self._act(uuid, SET_TAGS, actor, lambda c, r: {"tags": unique})

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
            node = node_uuid(conn, row["host"], row["node"])
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
            destinations = migration_destinations(conn, row, host)
            # The claim and the release below, locked in id order first (node_locks).
            source = node_ids(conn, compute_nodes.c.host == row["host"])
            lock_ids(conn, [*source, *(n["id"] for n in destinations)])
            for node in destinations:
                if claim(conn, node["uuid"], want):
                    release(conn, row["host"], row["node"], want)
                    return {
                        "host": node["host"],
                        "node": node["hypervisor_hostname"],
                        "availability_zone": self.scheduler.zone_of(node),
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
        if reason is not None:
            # Nova's lock schema: 1 to 255 characters, any of them (a reason, not a name);
            # longer, every cell database but SQLite refused it as a database error.
            if not reason:
                raise BlankText("reason")
            check_length("reason", reason)
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

        cell, after = retry_conflicts(lambda: self._commit(uuid, DELETE, actor, change))
        try:
            self.registry.queue_for_delete(uuid)
        except Exception:
            # The cell row is the truth; the flag only schedules the mapping's archival.
            log.exception("instance %s deleted but its mapping was not flagged", uuid)
        return self._delivered(cell, after)

    # ------------------------------------------------------------ machinery

    def _act(
        self, uuid: str, action: Action, actor: Actor, mutate: Mutation
    ) -> InstanceActionPayload:
        cell, after = retry_conflicts(lambda: self._commit(uuid, action, actor, mutate))
        return self._delivered(cell, after)

    def _commit(
        self, uuid: str, action: Action, actor: Actor, mutate: Mutation
    ) -> tuple[CellMapping, InstanceRow]:
        cell = self.registry.locate(uuid)
        with write_transaction(self.cell_engine_ready(cell)) as conn:
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
            changed = action.name in USAGE_ACTIONS
            nodes = read_nodes(conn, places_of(before, after)) if changed else []
            outbox.add(
                conn,
                action_events(action, before, after, cell.uuid, self.publisher_id, self.clock())
                + node_events(nodes, cell.uuid, self.publisher_id),
            )
        return cell, after

    def _check(self, row: InstanceRow, action: Action, actor: Actor) -> None:
        allowed = action.allowed or ANY_STATE
        # A reservation changes through cellsight.cells.reservations; only a rename is shared.
        if (
            row["deleted"]
            or row["vm_state"] not in allowed
            or (row["forthcoming"] and action is not RENAME)
        ):
            raise InvalidInstanceState(
                row["uuid"], action.describe(), row["vm_state"], set(allowed)
            )
        if row["locked"] and not actor.is_admin and not action.lock_exempt:
            raise InstanceLocked(row["uuid"], action.describe(), row["locked_reason"])

    def _delivered(self, cell: CellMapping, after: InstanceRow) -> InstanceActionPayload:
        self.deliver(cell)
        return action_payload(after, cell.uuid)

    def transaction(self, cell: CellMapping) -> AbstractContextManager[sa.Connection]:
        """A write transaction on ``cell`` whose ``outbox.add`` commits with the change;
        call ``deliver(cell)`` after it (the reservation and node modules do)."""
        return write_transaction(self.cell_engine_ready(cell))

    def deliver(self, cell: CellMapping) -> None:
        """Publish the cell's outbox now; on a bus failure it waits for the relay."""
        self.relay.deliver(self.registry.cell_engine(cell))

    def cell_engine_ready(self, cell: CellMapping) -> sa.Engine:
        engine = self.registry.cell_engine(cell)
        if cell.uuid not in self._outbox_ready:
            try:
                outbox.ensure_tables(engine)  # a cell created before the outbox existed
            except DatabaseUnavailable as exc:  # an operation's first touch of the cell
                raise CellUnavailable(cell.name, exc) from None
            self._outbox_ready.add(cell.uuid)
        return engine
