"""Forthcoming instances (reservations): capacity held before names and DNS exist.

A reservation is an ``instances`` row with ``forthcoming`` true, addressed by uuid (the
only mandatory attribute: name, project, user, flavor, cell and host are optional). The
resources its flavor names are claimed on its node like a real instance's, and the
node's ``forthcoming_reservations`` counts it, so the scheduler counts it as used and
committing it never needs capacity. Commit requires name, project, user, flavor and
host, and turns the row into an active instance with Nova's ``instance.create.*``.

Events (payload ``InstanceActionPayload`` 1.9, ``forthcoming: true`` until commit; each
operation also emits ``compute_node.update`` for the nodes whose counts it changed):

* ``instance.reserve``: a reservation was made;
* ``instance.reservation_modify``: its project, user, flavor or host changed;
* ``instance.reservation_rename``: its name changed (``old_display_name`` is not set:
  the payload is an action payload);
* ``instance.reservation_move``: the scheduler moved it to another host of its cell to
  make room for a real instance (``cellsight.cells.room``);
* ``instance.reservation_cancel``: cancelled (soft-deleted, as instances are);
* ``instance.create.start`` / ``instance.update`` / ``instance.create.end``: committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import retry_conflicts, write_transaction
from cellsight.cells.errors import CellsError, DuplicateInstance, InstanceNotFound, NoValidHost
from cellsight.cells.events import create_events
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import ADMIN, Actor, host_name_of
from cellsight.cells.leftovers import place_reclaiming
from cellsight.cells.mappings import CellMapping
from cellsight.cells.node_locks import lock_hosts
from cellsight.cells.nodeevents import node_events, places_of, read_nodes
from cellsight.cells.reads import get_instance
from cellsight.cells.reservation_rows import (
    count_on_node,
    flavor_fields,
    host_row,
    new_row,
    reservation_uuid,
)
from cellsight.cells.rows import InstanceRow, action_payload
from cellsight.cells.scheduler import (
    HostState,
    Resources,
    claim,
    claim_choices,
    read_answering,
    release,
)
from cellsight.cells.schema import instance_mappings, instances
from cellsight.cells.text_rules import check_given
from cellsight.notifications.envelope import Notification
from cellsight.notifications.objects import Selection
from cellsight.notifications.payloads import InstanceActionPayload

if TYPE_CHECKING:
    from cellsight.cells.operations import Operations

log = logging.getLogger(__name__)

RESERVE = "instance.reserve"
MODIFY = "instance.reservation_modify"
RENAME = "instance.reservation_rename"
MOVE = "instance.reservation_move"
CANCEL = "instance.reservation_cancel"
REQUIRED_TO_COMMIT = ("display_name", "project_id", "user_id", "flavor", "host")
_UNSET: Any = object()
# Changes that move a claim between nodes (``_commit`` reads and announces the nodes).
MOVES = frozenset({"host", "flavor", "forthcoming", "deleted"})


class NotForthcoming(CellsError):
    reason = "not_forthcoming"

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        super().__init__(f"instance {uuid} is not a reservation (built, or cancelled)")


class ReservationIncomplete(CellsError):
    reason = "reservation_incomplete"

    def __init__(self, uuid: str, missing: list[str]) -> None:
        self.uuid, self.missing = uuid, missing
        super().__init__(f"reservation {uuid} cannot be committed without {', '.join(missing)}")


@dataclass
class ReserveResult:
    uuid: str
    cell: CellMapping
    selections: list[Selection] = field(default_factory=list)
    payload: InstanceActionPayload | None = None


# Node rows read in the transaction, for their compute_node.update events.
Nodes = list[dict[str, Any]]


def _host_name(row: InstanceRow, name: str | None) -> dict[str, Any]:
    """A reservation named after it was reserved (rename, modify, commit) takes its host
    name from that name, as a boot's; once set, it stays."""
    return {"hostname": host_name_of(name)} if name and not row["hostname"] else {}


def reservation_event(
    event_type: str, row: InstanceRow, cell: CellMapping, nodes: list[dict[str, Any]], ops: Any
) -> list[Notification]:
    return [
        Notification.create(event_type, ops.publisher_id, action_payload(row, cell.uuid)),
        *node_events(nodes, cell.uuid, ops.publisher_id),
    ]


class Reservations:
    """The reservation operations, published through ``ops``' publish-after-commit point."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops
        self.registry = ops.registry
        # (node, cell) uuids of rows committed operations changed: a node cache drops them
        # even if their notifications wait in the outbox or go out through another relay.
        self.touched: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ reserve

    def reserve(
        self,
        uuid: str | None = None,
        *,
        name: str | None = None,
        project_id: str | None = None,
        user_id: str | None = None,
        flavor: str | None = None,
        cell: str | None = None,
        host: str | None = None,
        actor: Actor = ADMIN,
    ) -> ReserveResult:
        uuid = reservation_uuid(uuid)
        check_given(
            name=name, project_id=project_id, user_id=user_id, flavor=flavor, cell=cell, host=host
        )
        spec = get_flavor(flavor) if flavor else None
        target, selections = self._place(spec, cell, host)
        answered: list[Selection] = []  # the last attempt's
        try:
            place_reclaiming(self.registry, target.uuid, [(uuid, project_id or "", user_id)])
        except sa.exc.IntegrityError:
            raise DuplicateInstance(uuid) from None

        def insert() -> tuple[InstanceRow, Nodes]:
            with self.ops.transaction(target) as conn:
                chosen, node, answer = self._claim(conn, spec, selections, host)
                if spec is not None and node is not None:
                    # Nova's scheduler answers a forced host with its one Selection.
                    zone = self.ops.scheduler.default_availability_zone
                    answer = [HostState(target, node).selection(Resources.of_flavor(spec), zone)]
                answered[:] = answer
                row = new_row(uuid, name, project_id, user_id, spec, chosen, self.ops.clock())
                try:
                    conn.execute(instances.insert().values(**row))
                except sa.exc.IntegrityError:
                    raise DuplicateInstance(uuid) from None
                count_on_node(conn, chosen[0], chosen[1], 1)
                if self.ops.before_commit is not None:
                    self.ops.before_commit("reserve", conn)
                after = get_instance(conn, uuid)
                assert after is not None
                nodes = read_nodes(conn, places_of(after))
                outbox.add(conn, reservation_event(RESERVE, after, target, nodes, self.ops))
            return after, nodes

        try:
            after, nodes = retry_conflicts(insert)
        except BaseException:
            self.registry.unmap_instances([uuid])
            raise
        self.touched.update((str(n["uuid"]), target.uuid) for n in nodes)
        self.ops.deliver(target)
        return ReserveResult(uuid, target, answered, action_payload(after, target.uuid))

    def _place(
        self, spec: dict[str, Any] | None, cell: str | None, host: str | None
    ) -> tuple[CellMapping, list[Selection]]:
        if spec is not None and host is None:
            (choices,) = self.ops.scheduler.select_destinations(spec, cell=cell)
            return self.registry.get_cell(choices[0].cell_uuid), choices
        cells = self.registry.placeable_cells(cell)
        if cell is not None:
            return cells[0], []
        if host is not None:  # the cells that have it, among those that answer
            found = read_answering(self.registry, cells, lambda conn: host_row(conn, host))
            cells = [cell for cell, row in found if row is not None]
        if not cells:
            raise NoValidHost("no enabled cell" + (f" has a host {host!r}" if host else ""))
        return cells[0], []

    def _claim(
        self,
        conn: sa.Connection,
        spec: dict[str, Any] | None,
        selections: list[Selection],
        host: str | None,
    ) -> tuple[tuple[str | None, str | None, str | None], dict[str, Any] | None, list[Selection]]:
        """(host, node, availability zone) of the node that now holds the reservation,
        that node's row when it was named by its host (not a scheduler's pick), and the
        scheduler's answer from the host claimed (``claim_first``)."""
        if selections:
            want = Resources.of_flavor(spec or {})
            answer = claim_choices(conn, [("the reservation", selections)], want)[0]
            s = answer[0]
            return (s.service_host, s.nodename, s.availability_zone), None, answer
        if host is None:
            return (None, None, None), None, []
        node = host_row(conn, host)
        if node is None:
            raise NoValidHost(f"{host!r} is not a compute host of this cell")
        if spec is not None and not claim(conn, node["uuid"], Resources.of_flavor(spec)):
            raise NoValidHost(f"host {host!r} has no room for {spec['name']}")
        zone = self.ops.scheduler.zone_of(node)
        return (node["host"], node["hypervisor_hostname"], zone), node, []

    # ------------------------------------------------------------ modify/rename

    def rename(self, uuid: str, name: str | None, actor: Actor = ADMIN) -> InstanceActionPayload:
        check_given(name=name)

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            return {"display_name": name, **_host_name(row, name)}

        return self._change(uuid, RENAME, change)

    def modify(
        self,
        uuid: str,
        *,
        name: str | None = _UNSET,
        project_id: str | None = _UNSET,
        user_id: str | None = _UNSET,
        flavor: str | None = _UNSET,
        host: str | None = _UNSET,
        actor: Actor = ADMIN,
    ) -> InstanceActionPayload:
        """Change any attribute; a new flavor or host moves the claim, or fails whole."""
        check_given(flavor=flavor, name=name, project_id=project_id, user_id=user_id, host=host)
        plain = {"display_name": name, "project_id": project_id, "user_id": user_id}

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            out = {k: v for k, v in plain.items() if v is not _UNSET}
            out.update(_host_name(row, None if name is _UNSET else name))
            new_spec: dict[str, Any] | None = (
                row["flavor"] if flavor is _UNSET else get_flavor(flavor) if flavor else None
            )
            new_host = row["host"] if host is _UNSET else host
            if new_spec == row["flavor"] and new_host == row["host"]:
                return out
            lock_hosts(conn, (row["host"], new_host))
            release(conn, row["host"], row["node"], Resources.of_flavor(row["flavor"] or {}))
            count_on_node(conn, row["host"], row["node"], -1)
            chosen, _, _ = self._claim(conn, new_spec, [], new_host)
            count_on_node(conn, chosen[0], chosen[1], 1)
            out.update(host=chosen[0], node=chosen[1], availability_zone=chosen[2])
            out.update(flavor_fields(new_spec))
            return out

        payload = self._change(uuid, MODIFY, change)
        if project_id is not _UNSET or user_id is not _UNSET:
            self._remap(payload)
        return payload

    def _remap(self, payload: InstanceActionPayload) -> None:
        """The mapping's owner follows the row's: listings scope by it."""
        m = instance_mappings.c
        with write_transaction(self.registry.api_engine) as conn:
            conn.execute(
                instance_mappings.update()
                .where(m.instance_uuid == payload.uuid)
                .values(project_id=payload.tenant_id or "", user_id=payload.user_id)
            )

    # ----------------------------------------------------------- commit/cancel

    def commit(self, uuid: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        """Build it: never a capacity question, the resources are held already."""

        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            missing = [f for f in REQUIRED_TO_COMMIT if not row.get(f)]
            if missing:
                raise ReservationIncomplete(uuid, missing)
            count_on_node(conn, row["host"], row["node"], -1)
            now = self.ops.clock()
            return {
                **_host_name(row, row["display_name"]),
                "forthcoming": False,
                "vm_state": "active",
                "power_state": "running",
                "launched_at": now,
            }

        def events(cell: CellMapping, after: InstanceRow, nodes: Nodes) -> list[Notification]:
            publisher_id = self.ops.publisher_id
            return create_events(after, cell.uuid, publisher_id, self.ops.clock()) + node_events(
                nodes, cell.uuid, publisher_id
            )

        cell, after = self._commit(uuid, "commit", change, events)
        return action_payload(after, cell.uuid)

    def cancel(self, uuid: str, actor: Actor = ADMIN) -> InstanceActionPayload:
        def change(conn: sa.Connection, row: InstanceRow) -> dict[str, Any]:
            release(conn, row["host"], row["node"], Resources.of_flavor(row["flavor"] or {}))
            count_on_node(conn, row["host"], row["node"], -1)
            now = self.ops.clock()
            return {
                "vm_state": "deleted",
                "deleted": True,
                "deleted_at": now,
                "terminated_at": now,
            }

        payload = self._change(uuid, CANCEL, change)
        try:
            self.registry.queue_for_delete(uuid)
        except CellsError:
            # Cancelled in its cell, the truth: the flag only schedules archival (as delete).
            log.exception("reservation %s cancelled but its mapping was not flagged", uuid)
        return payload

    # ---------------------------------------------------------------- machinery

    def _change(
        self, uuid: str, event_type: str, mutate: Callable[[sa.Connection, InstanceRow], Any]
    ) -> InstanceActionPayload:
        def events(cell: CellMapping, after: InstanceRow, nodes: Nodes) -> list[Notification]:
            return reservation_event(event_type, after, cell, nodes, self.ops)

        cell, after = self._commit(uuid, event_type, mutate, events)
        return action_payload(after, cell.uuid)

    def _commit(
        self,
        uuid: str,
        name: str,
        mutate: Callable[[sa.Connection, InstanceRow], Any],
        events: Callable[[CellMapping, InstanceRow, Nodes], list[Notification]],
    ) -> tuple[CellMapping, InstanceRow]:
        """Change the reservation; its notifications go into the outbox in the same
        transaction and are delivered after the commit."""
        cell = self.registry.locate(uuid)

        def update() -> tuple[InstanceRow, Nodes]:
            with self.ops.transaction(cell) as conn:
                before = get_instance(conn, uuid, for_update=True)
                if before is None:
                    raise InstanceNotFound(uuid, f"cell {cell.name}")
                if not before["forthcoming"] or before["deleted"]:
                    raise NotForthcoming(uuid)
                changes = mutate(conn, before)
                moved = changes.keys() & MOVES
                if not moved and all(before[k] == v for k, v in changes.items()):
                    # Nothing to change (a modify or rename to what it holds): no new
                    # revision, no notification. A move has written the nodes already
                    # (a host the database compares equal, 'h1 ' on MariaDB): announced.
                    return before, []
                changes.update(revision=before["revision"] + 1, updated_at=self.ops.clock())
                where = instances.c.id == before["id"]
                conn.execute(instances.update().where(where).values(**changes))
                if self.ops.before_commit is not None:
                    self.ops.before_commit(name, conn)
                after = get_instance(conn, uuid)
                assert after is not None
                nodes = read_nodes(conn, places_of(before, after)) if moved else []
                outbox.add(conn, events(cell, after, nodes))
            return after, nodes

        after, nodes = retry_conflicts(update)
        self.touched.update((str(n["uuid"]), cell.uuid) for n in nodes)
        self.ops.deliver(cell)
        return cell, after
