"""Compute nodes of a cell: registering hosts the scheduler can place instances on."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import retry_conflicts, write_transaction
from cellsight.cells.errors import CellsError, NoValidHost
from cellsight.cells.schema import compute_nodes, utcnow
from cellsight.cells.text_rules import check_given


class DuplicateHost(CellsError):
    reason = "duplicate_host"

    def __init__(self, host: str, node: str, cell: str | None = None) -> None:
        where = "this cell" if cell is None else f"cell {cell}"
        super().__init__(f"compute node {host}/{node} is already registered in {where}")


def add_compute_node(
    engine: sa.Engine,
    host: str,
    *,
    hypervisor_hostname: str | None = None,
    vcpus: int = 64,
    memory_mb: int = 262_144,
    local_gb: int = 4_000,
    availability_zone: str | None = "nova",
    cpu_allocation_ratio: float = 4.0,
    ram_allocation_ratio: float = 1.0,
    disk_allocation_ratio: float = 1.0,
    uuid: str | None = None,
    in_transaction: Callable[[sa.Connection, dict[str, Any]], object] | None = None,
) -> dict[str, Any]:
    """Register one compute node with nothing used yet; returns its row.
    ``in_transaction(conn, row)`` runs in the insert's transaction (the outbox)."""
    check_given(
        host=host, hypervisor_hostname=hypervisor_hostname, availability_zone=availability_zone
    )
    if min(vcpus, memory_mb, local_gb) < 0:
        raise ValueError("vcpus, memory and disk must not be negative")
    now = utcnow()
    row: dict[str, Any] = {
        "uuid": uuid or str(uuidlib.uuid4()),
        "host": host,
        "hypervisor_hostname": hypervisor_hostname or host,
        "availability_zone": availability_zone,
        "memory_mb": memory_mb,
        "memory_mb_used": 0,
        "vcpus": vcpus,
        "vcpus_used": 0,
        "local_gb": local_gb,
        "local_gb_used": 0,
        "cpu_allocation_ratio": cpu_allocation_ratio,
        "ram_allocation_ratio": ram_allocation_ratio,
        "disk_allocation_ratio": disk_allocation_ratio,
        "forthcoming_reservations": 0,
        "disabled": False,
        "offline": False,
        "created_at": now,
        "updated_at": now,
        "revision": 1,
        "deleted": False,
    }

    def insert() -> None:
        with write_transaction(engine) as conn:
            conn.execute(compute_nodes.insert().values(**row))
            if in_transaction is not None:
                in_transaction(conn, row)

    try:
        retry_conflicts(insert)
    except sa.exc.IntegrityError:
        raise DuplicateHost(host, row["hypervisor_hostname"]) from None
    return row


def node_uuid(conn: sa.Connection, host: str | None, node: str | None) -> str | None:
    """The uuid of ``host``'s compute node (``node`` when it has several), if any."""
    c = compute_nodes.c
    query = sa.select(c.uuid).where(c.host == host, c.deleted.is_(False))
    if node is not None:
        query = query.where(c.hypervisor_hostname == node)
    value = conn.execute(query).scalar()
    return None if value is None else str(value)


def migration_destinations(
    conn: sa.Connection, row: Mapping[str, Any], host: str | None
) -> list[dict[str, Any]]:
    """Enabled, online compute nodes of the cell other than ``row``'s host (or only
    ``host``), most free memory first (Nova's default weigher)."""
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
