"""Making room for a real instance by moving reservations within their cell.

A forthcoming instance moves for free (nothing runs yet), so when no host of a cell
can take a boot, the scheduler looks for a host that could, once some of its
reservations were moved to other hosts of the same cell with room for them. The moves
happen in one cell transaction (claims taken on the new hosts, released on the old,
the reservation counts moved) and each emits ``instance.reservation_move`` with the
nodes it touched; then the boot is scheduled again. Reservations without a flavor hold
nothing and are never moved; an instance is never refused while a move would do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import retry_conflicts
from cellsight.cells.errors import (
    ConcurrentUpdate,
    DatabaseUnavailable,
    NoValidHost,
    TransactionConflict,
)
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping
from cellsight.cells.node_locks import lock_hosts
from cellsight.cells.nodeevents import node_events, read_nodes
from cellsight.cells.reads import get_instance
from cellsight.cells.reservations import MOVE, count_on_node, reservation_event
from cellsight.cells.scheduler import HostState, Resources, claim, release
from cellsight.cells.schema import compute_nodes, instances
from cellsight.notifications.envelope import Notification
from cellsight.notifications.objects import Selection

if TYPE_CHECKING:
    from cellsight.cells.operations import Operations

log = logging.getLogger(__name__)
MOVED, CHANGED, NOTHING = "moved", "changed", "nothing"
REPLANS = 3  # plans per cell while its reservations keep changing under them


def schedule(
    ops: Operations, flavor: Mapping[str, Any], request: BootRequest
) -> list[list[Selection]]:
    """The scheduler's destinations, moving reservations when that makes room."""
    for _ in range(request.count + 1):
        try:
            return ops.scheduler.select_destinations(
                flavor,
                count=request.count,
                cell=request.cell,
                availability_zone=request.availability_zone,
            )
        except NoValidHost:
            if not make_room(ops, flavor, request.cell, request.availability_zone):
                raise
    raise NoValidHost(f"moving reservations did not make room for {flavor.get('name')}")


def make_room(
    ops: Operations, flavor: Mapping[str, Any], cell: str | None, zone: str | None = None
) -> bool:
    want = Resources.of_flavor(flavor)
    cells = ops.registry.placeable_cells(cell or None)
    for mapping in cells:
        for _ in range(REPLANS):
            try:
                outcome = retry_conflicts(partial(_room_in, ops, mapping, want, zone))
            except TransactionConflict:
                raise  # a deadlock that outlasted its retries: not a cell to skip
            except DatabaseUnavailable as exc:  # as the scheduler: the others may have room
                log.warning("making room: skipping cell %s: %s", mapping.name, exc)
                outcome = NOTHING
            if outcome is not CHANGED:
                break
        if outcome is MOVED:
            ops.deliver(mapping)
        if outcome is not NOTHING:  # moved, or reservations keep changing: schedule again
            return True
    return False


def _covers(free: Resources, freed: Resources, want: Resources) -> bool:
    return (
        free.vcpus + freed.vcpus >= want.vcpus
        and free.memory_mb + freed.memory_mb >= want.memory_mb
        and free.disk_gb + freed.disk_gb >= want.disk_gb
    )


def _add(a: Resources, b: Resources) -> Resources:
    return Resources(a.vcpus + b.vcpus, a.memory_mb + b.memory_mb, a.disk_gb + b.disk_gb)


def _room_in(ops: Operations, cell: CellMapping, want: Resources, zone: str | None) -> str:
    """Move reservations off one node of ``cell`` so ``want`` fits; the moves'
    notifications go into the outbox in the same transaction. ``CHANGED``: a planned
    reservation changed meanwhile, nothing was written (plan again, in a new transaction:
    MariaDB's snapshot would show the old rows again)."""
    c, i = compute_nodes.c, instances.c
    with ops.transaction(cell) as conn:
        hosts = [
            HostState(cell, dict(n))
            for n in conn.execute(
                sa.select(compute_nodes).where(
                    c.deleted.is_(False), c.disabled.is_(False), c.offline.is_(False)
                )
            ).mappings()
        ]
        held = conn.execute(
            sa.select(instances).where(
                i.forthcoming.is_(True), i.deleted.is_(False), i.host.is_not(None)
            )
        ).mappings()
        # By node, not host: a reservation on another node of the host frees nothing here.
        by_node: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
        for found in held:
            if found["flavor"]:
                by_node.setdefault((found["host"], found["node"]), []).append(dict(found))
        for target in sorted(hosts, key=lambda h: (h.weight(), h.node["host"])):
            if zone is not None and ops.scheduler.zone_of(target.node) != zone:
                continue
            place = (target.node["host"], target.node["hypervisor_hostname"])
            plan = _plan(target, hosts, by_node.get(place, []), want)
            if plan is None:
                continue
            if not _still_as_read(conn, [row for row, _ in plan]):
                return CHANGED
            _move(ops, conn, cell, target, plan)
            return MOVED
    return NOTHING


def _still_as_read(conn: sa.Connection, rows: list[dict[str, Any]]) -> bool:
    """Lock the planned reservations (by primary key, in id order: record locks only, so
    no insert waits on them) and check that none changed since the plan read them.

    Without this, on PostgreSQL/MariaDB a commit, cancel or modify committing between the
    plan's read and the move's UPDATE is overwritten: the move claims for a cancelled
    reservation forever, releases its old node twice, or moves a built instance. SQLite's
    BEGIN IMMEDIATE already holds the database."""
    i = instances.c
    seen = {
        r["id"]: r
        for r in conn.execute(
            sa.select(i.id, i.revision, i.forthcoming, i.deleted, i.host, i.node)
            .where(i.id.in_([row["id"] for row in rows]))
            .order_by(i.id)
            .with_for_update()
        ).mappings()
    }
    keys = ("revision", "forthcoming", "deleted", "host", "node")
    return all(
        (now := seen.get(row["id"])) is not None and all(now[k] == row[k] for k in keys)
        for row in rows
    )


def _move(
    ops: Operations,
    conn: sa.Connection,
    cell: CellMapping,
    target: HostState,
    plan: list[tuple[dict[str, Any], HostState]],
) -> None:
    i = instances.c
    moved = []
    lock_hosts(conn, [host for row, dest in plan for host in (row["host"], dest.node["host"])])
    for row, dest in plan:
        used = Resources.of_flavor(row["flavor"])
        if not claim(conn, dest.node["uuid"], used):
            raise NoValidHost("a host filled up while reservations were moved")
        release(conn, row["host"], row["node"], used)
        count_on_node(conn, row["host"], row["node"], -1)
        count_on_node(conn, dest.node["host"], dest.node["hypervisor_hostname"], 1)
        done = conn.execute(
            instances.update()
            .where(i.id == row["id"], i.revision == row["revision"])
            .values(
                host=dest.node["host"],
                node=dest.node["hypervisor_hostname"],
                availability_zone=ops.scheduler.zone_of(dest.node),
                revision=row["revision"] + 1,
                updated_at=ops.clock(),
            )
        )
        if done.rowcount != 1:  # locked and checked above: never overwrite another change
            raise ConcurrentUpdate(row["uuid"])
        moved.append(get_instance(conn, row["uuid"]))
    touched = [target, *(dest for _, dest in plan)]
    nodes = read_nodes(conn, [(h.node["host"], h.node["hypervisor_hostname"]) for h in touched])
    events: list[Notification] = []
    for after in moved:
        assert after is not None
        events += reservation_event(MOVE, after, cell, [], ops)
    outbox.add(conn, events + node_events(nodes, cell.uuid, ops.publisher_id))


def _plan(
    target: HostState, hosts: list[HostState], held: list[dict[str, Any]], want: Resources
) -> list[tuple[dict[str, Any], HostState]] | None:
    """Which reservations of ``target`` go where so that ``want`` fits on it, or None."""
    plan: list[tuple[dict[str, Any], HostState]] = []
    freed = Resources(0, 0, 0)
    others = [h for h in hosts if h is not target]
    taken = {id(h): h.taken for h in others}
    try:
        for row in sorted(held, key=lambda r: -Resources.of_flavor(r["flavor"]).memory_mb):
            if _covers(target.free, freed, want):
                break
            used = Resources.of_flavor(row["flavor"])
            dest = next((h for h in others if h.fits(used)), None)
            if dest is None:
                continue
            dest.taken = _add(dest.taken, used)
            freed = _add(freed, used)
            plan.append((row, dest))
        ok = bool(plan) and _covers(target.free, freed, want)
        return plan if ok else None
    finally:
        for h in others:  # planning only: the next candidate starts from the real state
            h.taken = taken[id(h)]
