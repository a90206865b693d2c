"""Making room for a real instance by moving reservations within their cell.

A forthcoming instance moves for free (nothing runs yet), so when no host of a cell
can take a boot, the boot looks for hosts that could, once some of their reservations
were moved to other hosts of the same cell with room for them. The moves and the boot
are one cell transaction (``cellsight.cells.boots``): claims taken on the new hosts,
released on the old, the reservation counts moved, each move announced with
``instance.reservation_move``, and the instances claimed and inserted; so no
reservation made meanwhile can take the room the moves made. Reservations without a
flavor hold nothing and are never moved; an instance is never refused while a move
would do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from cellsight.cells.errors import ConcurrentUpdate
from cellsight.cells.mappings import CellMapping
from cellsight.cells.node_locks import lock_hosts
from cellsight.cells.nodeevents import Place
from cellsight.cells.reads import get_instance
from cellsight.cells.reservation_rows import count_on_node
from cellsight.cells.reservations import MOVE, reservation_event
from cellsight.cells.scheduler import HostState, Resources, claim, release
from cellsight.cells.schema import compute_nodes, instances
from cellsight.notifications.envelope import Notification

if TYPE_CHECKING:
    from cellsight.cells.operations import Operations

REPLANS = 3  # plans per cell while its reservations keep changing under them
Move = tuple[dict[str, Any], HostState]


class PlanChanged(Exception):
    """A planned reservation or host changed between the plan's read and its locks: the
    transaction rolls back and plans again in a new one (MariaDB's snapshot would show
    the old rows again)."""


@dataclass
class Room:
    """Where each instance of a boot goes, once ``moves`` (reservation, new host) are made."""

    targets: list[HostState] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)


class Moved(NamedTuple):
    """The moves' events and the places whose nodes they changed."""

    events: list[Notification]
    places: list[Place]


def plan_room(
    ops: Operations,
    conn: sa.Connection,
    cell: CellMapping,
    want: Resources,
    count: int,
    zone: str | None,
) -> Room | None:
    """Hosts of ``cell`` for ``count`` instances of ``want`` and the moves that make room
    on them (read without locks), or None if no moves would do."""
    c, i = compute_nodes.c, instances.c
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
    by_node: dict[Place, list[dict[str, Any]]] = {}
    for found in held:
        if found["flavor"]:
            by_node.setdefault((found["host"], found["node"]), []).append(dict(found))
    ranked = sorted(
        (h for h in hosts if zone is None or ops.scheduler.zone_of(h.node) == zone),
        key=lambda h: (h.weight(), h.node["host"]),
    )
    room = Room()
    for _ in range(count):
        target, plan = _next_target(ranked, hosts, by_node, want)
        if target is None:
            return None
        for row, dest in plan:
            used = Resources.of_flavor(row["flavor"])
            dest.taken = _add(dest.taken, used)
            target.taken = target.taken - used
            by_node[(row["host"], row["node"])].remove(row)  # moved once at most
        target.taken = _add(target.taken, want)
        room.targets.append(target)
        room.moves += plan
    return room


def _next_target(
    ranked: list[HostState],
    hosts: list[HostState],
    by_node: dict[Place, list[dict[str, Any]]],
    want: Resources,
) -> tuple[HostState | None, list[Move]]:
    """The best host that fits ``want`` as it is, else the best one that would after
    moves (and those moves)."""
    fitting = next((h for h in ranked if h.fits(want)), None)
    if fitting is not None:
        return fitting, []
    for target in ranked:
        place = (target.node["host"], target.node["hypervisor_hostname"])
        plan = _plan(target, hosts, by_node.get(place, []), want)
        if plan is not None:
            return target, plan
    return None, []


def move(ops: Operations, conn: sa.Connection, cell: CellMapping, room: Room) -> Moved:
    """Lock the planned reservations and check that they did not change, then every
    node the room touches (in id order, once; rows before nodes, as every instance
    action does), and move them; ``PlanChanged`` if the cell no longer matches the plan."""
    if room.moves and not _still_as_read(conn, [row for row, _ in room.moves]):
        raise PlanChanged
    lock_hosts(
        conn,
        [
            *(host for row, dest in room.moves for host in (row["host"], dest.node["host"])),
            *(target.node["host"] for target in room.targets),
        ],
    )
    i = instances.c
    events: list[Notification] = []
    places: list[Place] = []
    for row, dest in room.moves:
        used = Resources.of_flavor(row["flavor"])
        if not claim(conn, dest.node["uuid"], used):
            raise PlanChanged  # the host filled up between the plan's read and the lock
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
        after = get_instance(conn, row["uuid"])
        assert after is not None
        events += reservation_event(MOVE, after, cell, [], ops)
        places += [(row["host"], row["node"]), (after["host"], after["node"])]
    return Moved(events, places)


def _covers(free: Resources, freed: Resources, want: Resources) -> bool:
    return (
        free.vcpus + freed.vcpus >= want.vcpus
        and free.memory_mb + freed.memory_mb >= want.memory_mb
        and free.disk_gb + freed.disk_gb >= want.disk_gb
    )


def _add(a: Resources, b: Resources) -> Resources:
    return Resources(a.vcpus + b.vcpus, a.memory_mb + b.memory_mb, a.disk_gb + b.disk_gb)


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


def _plan(
    target: HostState, hosts: list[HostState], held: list[dict[str, Any]], want: Resources
) -> list[Move] | None:
    """Which reservations of ``target`` go where so that ``want`` fits on it, or None."""
    plan: list[Move] = []
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
