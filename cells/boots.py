"""Booting instances: the scheduler's picks claimed and the rows inserted in one cell
transaction, or, when no host has room, reservations moved and the boot made in one
transaction of the cell (``cellsight.cells.room``).

Boot writes two databases. The instance mapping (API database) is written first,
then the instance rows (cell database). If the cell transaction fails, the mapping is
deleted again; if that clean-up fails too (or the process dies in between), a mapping
to a missing row remains, which readers treat as "not found", and which a new boot or
reservation of its uuid, or ``cells remove --force``, removes once it is older than any
build (``leftovers``). The reverse order could leave an instance row that no lookup by
uuid can find.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from cellsight.cells import outbox, room
from cellsight.cells.database import connect, retry_conflicts, write_transaction
from cellsight.cells.errors import (
    DatabaseUnavailable,
    DuplicateInstance,
    NoValidHost,
    TransactionConflict,
)
from cellsight.cells.events import create_events
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import Actor, BootRequest, new_instance_row
from cellsight.cells.leftovers import place_reclaiming
from cellsight.cells.mappings import CellMapping
from cellsight.cells.nodeevents import Place, node_events, places_of, read_nodes
from cellsight.cells.reads import get_instance
from cellsight.cells.rows import InstanceRow, create_payload
from cellsight.cells.scheduler import Resources, claim, claim_choices
from cellsight.cells.schema import instances
from cellsight.notifications.envelope import Notification
from cellsight.notifications.objects import Selection
from cellsight.notifications.payloads import InstanceCreatePayload

if TYPE_CHECKING:
    from cellsight.cells.operations import Operations

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class BootResult:
    cell: CellMapping
    selections: list[list[Selection]]
    instances: list[InstanceCreatePayload] = field(default_factory=list)


def boot(ops: Operations, request: BootRequest, actor: Actor) -> BootResult:
    flavor = get_flavor(request.flavor)
    uuids = request.instance_uuids()
    try:
        selections = ops.scheduler.select_destinations(
            flavor,
            count=request.count,
            cell=request.cell,
            availability_zone=request.availability_zone,
        )
    except NoValidHost as refusal:
        # A forthcoming instance moves for free: make room in a tight cell rather than refuse.
        made = _boot_making_room(ops, flavor, request, uuids, actor)
        if made is None:
            raise refusal from None
        cell, selections, rows = made
    else:
        cell = ops.registry.get_cell(selections[0][0].cell_uuid)
        want = Resources.of_flavor(flavor)

        def attempt() -> tuple[list[list[Selection]], list[InstanceRow]]:
            with write_transaction(ops.cell_engine_ready(cell)) as conn:
                answers = claim_choices(conn, list(zip(uuids, selections, strict=True)), want)
                chosen = [answer[0] for answer in answers]
                rows = insert_booted(ops, conn, cell, request, flavor, uuids, chosen, actor)
            return answers, rows

        selections, rows = mapped(ops, cell, request, uuids, lambda: retry_conflicts(attempt))
    ops.deliver(cell)
    return BootResult(cell, selections, [create_payload(row, cell.uuid) for row in rows])


class _NoRoom(Exception):
    """No moves would make room in this cell."""


class _CellDown(Exception):
    """The cell's database could not be reached: skip the cell, as the scheduler does."""

    def __init__(self, cause: DatabaseUnavailable) -> None:
        self.cause = cause


def _boot_making_room(
    ops: Operations, flavor: dict[str, Any], request: BootRequest, uuids: list[str], actor: Actor
) -> tuple[CellMapping, list[list[Selection]], list[InstanceRow]] | None:
    """The boot, with the reservation moves that make room for it, in one transaction of
    the first cell where moves would do; None if none would."""
    churned = False
    for cell in ops.registry.placeable_cells(request.cell or None):
        for _ in range(room.REPLANS):
            try:
                selections, rows = _boot_in(ops, cell, flavor, request, uuids, actor)
            except room.PlanChanged:
                continue
            except _NoRoom:
                break
            except _CellDown as down:  # the other cells may have room
                log.warning("making room: skipping cell %s: %s", cell.name, down.cause)
                break
            return cell, selections, rows
        else:
            churned = True  # every plan of this cell was overtaken by another change
    if churned:
        raise NoValidHost(
            f"reservations kept changing while room was made for {flavor.get('name')}"
        )
    return None


def _boot_in(
    ops: Operations,
    cell: CellMapping,
    flavor: dict[str, Any],
    request: BootRequest,
    uuids: list[str],
    actor: Actor,
) -> tuple[list[list[Selection]], list[InstanceRow]]:
    """A plan read without locks (``_NoRoom`` if none would do), the mappings written
    (only for a cell that has room, and outside its transaction: on SQLite the cell's
    write lock must not wait on the API database, which may even be the same file), then
    in one transaction of ``cell`` the plan read again under locks, the moves, the claims
    and the rows; the mappings are removed again if that fails."""
    want = Resources.of_flavor(flavor)

    def plan(conn: sa.Connection) -> room.Room | None:
        return room.plan_room(ops, conn, cell, want, request.count, request.availability_zone)

    try:
        engine = ops.cell_engine_ready(cell)
        with connect(engine) as conn:
            found = plan(conn) is not None
    except DatabaseUnavailable as exc:
        raise _CellDown(exc) from None
    if not found:
        raise _NoRoom

    def attempt() -> tuple[list[list[Selection]], list[InstanceRow]]:
        with write_transaction(engine) as conn:
            planned = plan(conn)
            if planned is None:
                raise room.PlanChanged  # the room went between the two reads
            moved = room.move(ops, conn, cell, planned)
            zone = ops.scheduler.default_availability_zone
            selections = [[target.selection(want, zone)] for target in planned.targets]
            for target in planned.targets:
                if not claim(conn, target.node["uuid"], want):
                    raise room.PlanChanged  # filled up between the plan's read and the lock
            chosen = [choices[0] for choices in selections]
            rows = insert_booted(ops, conn, cell, request, flavor, uuids, chosen, actor, *moved)
        return selections, rows

    def in_cell() -> tuple[list[list[Selection]], list[InstanceRow]]:
        try:
            return retry_conflicts(attempt)
        except TransactionConflict:
            raise  # a deadlock that outlasted its retries: not a cell to skip
        except DatabaseUnavailable as exc:
            raise _CellDown(exc) from None

    # The mapping's own failure (the API database's outage) stays the boot's error.
    return mapped(ops, cell, request, uuids, in_cell)


def mapped(
    ops: Operations, cell: CellMapping, request: BootRequest, uuids: list[str], fn: Callable[[], T]
) -> T:
    """``fn()`` (the cell's transaction) with the instances mapped to ``cell`` first; the
    mappings are removed again if it raises."""
    try:
        place_reclaiming(
            ops.registry, cell.uuid, [(u, request.project_id, request.user_id) for u in uuids]
        )
    except sa.exc.IntegrityError:
        taken = next((u for u in uuids if ops.registry.cells_of([u])), uuids[0])
        raise DuplicateInstance(taken) from None
    try:
        return fn()
    except BaseException:
        unmap(ops, uuids)
        raise


def unmap(ops: Operations, uuids: list[str]) -> None:
    try:
        ops.registry.unmap_instances(uuids)
    except Exception:
        log.exception("boot of %s failed and its mappings could not be removed", ", ".join(uuids))


def insert_booted(
    ops: Operations,
    conn: sa.Connection,
    cell: CellMapping,
    request: BootRequest,
    flavor: dict[str, Any],
    uuids: list[str],
    chosen: list[Selection],
    actor: Actor,
    events: Iterable[Notification] = (),
    places: Iterable[Place] = (),
) -> list[InstanceRow]:
    """The instances' rows on their claimed nodes, and into the outbox ``events`` (made
    earlier in this transaction), the creates and the state of every node touched (the
    instances' and ``places``)."""
    now = ops.clock()
    for index, (uuid, pick) in enumerate(zip(uuids, chosen, strict=True)):
        row = new_instance_row(request, flavor, uuid, index, pick, actor, now)
        try:
            conn.execute(instances.insert().values(**row))
        except sa.exc.IntegrityError:
            raise DuplicateInstance(uuid) from None
    if ops.before_commit is not None:
        ops.before_commit("create", conn)
    rows = [r for u in uuids if (r := get_instance(conn, u)) is not None]
    nodes = read_nodes(conn, [*places, *places_of(*rows)])
    outbox.add(
        conn,
        [*events]
        + [e for r in rows for e in create_events(r, cell.uuid, ops.publisher_id, now)]
        + node_events(nodes, cell.uuid, ops.publisher_id),
    )
    return rows
