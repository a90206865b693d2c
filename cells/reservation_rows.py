"""The rows a reservation starts as, and the small reads its operations share."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import sqlalchemy as sa

from cellsight.cells.errors import CellsError
from cellsight.cells.instances import host_name_of
from cellsight.cells.node_locks import locked_ids
from cellsight.cells.rows import InstanceRow, flavor_columns, payload_to_row
from cellsight.cells.schema import compute_nodes
from cellsight.notifications.payloads import FlavorPayload, InstanceActionPayload


def reservation_uuid(value: str | None) -> str:
    """``value`` in canonical form, or a new uuid when none is given."""
    if value is None:
        return str(uuidlib.uuid4())
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise CellsError(f"not a UUID: {value[:60]!r}") from None


def host_row(conn: sa.Connection, host: str) -> dict[str, Any] | None:
    c = compute_nodes.c
    # In id order: a host may have several nodes (Ironic); the same one every time.
    query = sa.select(compute_nodes).where(c.host == host, c.deleted.is_(False)).order_by(c.id)
    row = conn.execute(query).mappings().first()
    return None if row is None else dict(row)


def flavor_fields(spec: dict[str, Any] | None) -> dict[str, Any]:
    return {"flavor": spec, **flavor_columns(spec)}


def new_row(
    uuid: str,
    name: str | None,
    project_id: str | None,
    user_id: str | None,
    spec: dict[str, Any] | None,
    chosen: tuple[str | None, str | None, str | None],
    now: Any,
) -> InstanceRow:
    payload = InstanceActionPayload(
        uuid=uuid,
        user_id=user_id,
        tenant_id=project_id,
        display_name=name,
        host_name=host_name_of(name) if name else None,
        host=chosen[0],
        node=chosen[1],
        availability_zone=chosen[2],
        flavor=FlavorPayload.model_validate(spec) if spec else None,
        created_at=now,
        updated_at=now,
        state="building",
        power_state="pending",
        progress=0,
        metadata={},
        locked=False,
        tags=[],
        instance_name=f"instance-{uuid[:8]}",
        revision=1,
        forthcoming=True,
    )
    return payload_to_row(payload)


def count_on_node(conn: sa.Connection, host: str | None, node: str | None, delta: int) -> None:
    """Add ``delta`` to the reservation count of the node at (host, node)."""
    if host is None:
        return
    c = compute_nodes.c
    # Not a deleted node's: its resources are not given back either (``release``).
    where = [c.host == host, c.deleted.is_(False)]
    where += [c.hypervisor_hostname == node] if node else []
    total = c.forthcoming_reservations + delta
    conn.execute(
        compute_nodes.update()
        .where(c.id.in_(locked_ids(conn, *where)))
        .values(
            forthcoming_reservations=sa.case((total < 0, 0), else_=total),
            revision=c.revision + 1,
        )
    )
