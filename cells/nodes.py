"""Compute nodes of a cell: registering hosts the scheduler can place instances on."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import sqlalchemy as sa

from cells.database import write_transaction
from cells.errors import CellsError
from cells.schema import compute_nodes, utcnow


class DuplicateHost(CellsError):
    reason = "duplicate_host"

    def __init__(self, host: str, node: str) -> None:
        super().__init__(f"compute node {host}/{node} is already registered in this cell")


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
) -> dict[str, Any]:
    """Register one compute node with nothing used yet; returns its row."""
    if not host:
        raise ValueError("a compute node needs a host name")
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
    try:
        with write_transaction(engine) as conn:
            conn.execute(compute_nodes.insert().values(**row))
    except sa.exc.IntegrityError:
        raise DuplicateHost(host, row["hypervisor_hostname"]) from None
    return row
