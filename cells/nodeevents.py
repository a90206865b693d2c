"""Compute-node notifications: the node rows an operation changed, as versioned events.

Event type ``compute_node.update`` (priority INFO), payload ``cellsight``
``ComputeNodePayload`` 1.0: the node's whole row (uuid, host, hypervisor hostname, cell,
memory/vcpus/disk totals and used, forthcoming reservations, disabled, offline,
updated_at) and its ``revision``, which every change of the row bumps, so the indexer
keeps the newest by the same external-version rule as instances.

The rows are read inside the operation's transaction (the state it commits) and the
events go out with the instance events through the operation's one publish-after-commit
point, so a rolled-back operation emits nothing for its nodes either.

Node administration lives here too: enable/disable (the scheduler skips disabled
nodes) and offline/online (a node whose live state cannot be read).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import connect, retry_conflicts
from cellsight.cells.errors import CellsError, DatabaseUnavailable
from cellsight.cells.node_locks import locked_ids
from cellsight.cells.nodes import DuplicateHost, add_compute_node, node_uuid
from cellsight.cells.rows import node_to_payload
from cellsight.cells.schema import compute_nodes, utcnow
from cellsight.notifications.envelope import Notification
from cellsight.notifications.objects import NODE_UPDATE, ComputeNodePayload

if TYPE_CHECKING:
    from cellsight.cells.mappings import CellMapping
    from cellsight.cells.operations import Operations

log = logging.getLogger(__name__)

# Actions that move resources between nodes or give them back.
USAGE_ACTIONS = frozenset({"delete", "resize", "live_migration_post"})

Place = tuple[str | None, str | None]  # (host, hypervisor hostname)


class ComputeNodeNotFound(CellsError):
    reason = "compute_node_not_found"

    def __init__(self, host: str, cell: str) -> None:
        super().__init__(f"no compute node {host!r} in cell {cell}")


def read_nodes(conn: sa.Connection, places: Iterable[Place]) -> list[dict[str, Any]]:
    """The current rows of the nodes at ``places`` (unknown or hostless places skipped)."""
    c = compute_nodes.c
    seen: dict[str, dict[str, Any]] = {}
    for host, node in dict.fromkeys(places):
        if host is None:
            continue
        query = sa.select(compute_nodes).where(c.host == host)
        if node is not None:
            query = query.where(c.hypervisor_hostname == node)
        for row in conn.execute(query).mappings():
            seen[str(row["uuid"])] = dict(row)
    return list(seen.values())


def places_of(*rows: Mapping[str, Any]) -> list[Place]:
    return [(row.get("host"), row.get("node")) for row in rows]


def node_events(
    rows: Iterable[Mapping[str, Any]], cell_uuid: str, publisher_id: str
) -> list[Notification]:
    return [
        Notification.create(NODE_UPDATE, publisher_id, node_to_payload(row, cell_uuid))
        for row in rows
    ]


def set_node_state(
    ops: Operations,
    cell: str,
    host: str,
    *,
    disabled: bool | None = None,
    offline: bool | None = None,
) -> list[ComputeNodePayload]:
    """Enable/disable or mark offline/online the node(s) of ``host`` in ``cell``."""
    mapping = ops.registry.get_cell(cell)
    changes: dict[str, Any] = {}
    if disabled is not None:
        changes["disabled"] = disabled
    if offline is not None:
        changes["offline"] = offline
    c = compute_nodes.c

    def update() -> list[dict[str, Any]]:
        with ops.transaction(mapping) as conn:
            ids = locked_ids(conn, c.host == host, c.deleted.is_(False))
            done = conn.execute(
                compute_nodes.update()
                .where(c.id.in_(ids))
                .values(**changes, revision=c.revision + 1, updated_at=utcnow())
            )
            if done.rowcount == 0:
                raise ComputeNodeNotFound(host, mapping.name)
            rows = read_nodes(conn, [(host, None)])
            outbox.add(conn, node_events(rows, mapping.uuid, ops.publisher_id))
        return rows

    rows = retry_conflicts(update)
    ops.deliver(mapping)
    return [node_to_payload(row, mapping.uuid) for row in rows]


def register_node(ops: Operations, cell: str, host: str, **spec: Any) -> ComputeNodePayload:
    """``cellsight.cells.nodes.add_compute_node`` that also announces the new node."""
    mapping = ops.registry.get_cell(cell)
    _refuse_host_of_another_cell(ops, mapping, host)
    row = add_compute_node(
        ops.cell_engine_ready(mapping),
        host,
        in_transaction=lambda conn, new: outbox.add(
            conn, node_events([new], mapping.uuid, ops.publisher_id)
        ),
        **spec,
    )
    ops.deliver(mapping)
    return node_to_payload(row, mapping.uuid)


def _refuse_host_of_another_cell(ops: Operations, mapping: CellMapping, host: str) -> None:
    """A host lives in one cell, as Nova's host mappings keep it: the same name in two
    made a reservation or a boot ``--host`` find the first (full) one and refuse, and
    its ``hostId`` the same in both. Best effort: a cell that cannot be read is skipped
    (logged), and two registrations at once in two cells are not serialised."""
    for other in ops.registry.list_cells():
        if other.uuid == mapping.uuid:
            continue
        try:
            with connect(ops.registry.cell_engine(other)) as conn:
                found = node_uuid(conn, host, None)
        except DatabaseUnavailable as exc:
            log.warning("cell %s not checked for host %s: %s", other.name, host, exc.message)
            continue
        if found is not None:
            raise DuplicateHost(host, host, other.name)
