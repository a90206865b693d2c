"""Instance rows ↔ instance payloads, and compute node rows → node payloads.

``payload_to_row`` and ``row_to_payload`` are inverse: a snapshot stored and read
back is equal to the one stored, the ``cell_uuid`` coming from the cell it is read in.
Fields of one event only (``fault``, ``state_update``, ``audit_period``,
``old_display_name``) are not instance state and are not stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from cellsight.notifications.base import VersionedObject
from cellsight.notifications.forms import AS_STORED
from cellsight.notifications.objects import ComputeNodePayload
from cellsight.notifications.payloads import (
    InstanceActionPayload,
    InstanceCreatePayload,
    InstancePayload,
    InstanceUpdatePayload,
)

P = TypeVar("P", bound=InstancePayload)

# Payload field → column, where the names differ (the columns keep Nova's DB names).
RENAMED: dict[str, str] = {
    "tenant_id": "project_id",
    "host_name": "hostname",
    "image_uuid": "image_ref",
    "state": "vm_state",
}
# Fields of the payload subclasses that are instance state, stored with the row.
SUBCLASS_STATE = ("tags", "keypairs", "trusted_image_certificates", "instance_name")
NOT_STORED = frozenset({"cell_uuid", "fault", "state_update", "audit_period", "old_display_name"})
NESTED_ONE = frozenset({"flavor"})
NESTED_MANY = frozenset({"ip_addresses", "block_devices", "shares", "keypairs"})

PAYLOAD_FIELDS: tuple[str, ...] = tuple(
    name
    for name in dict.fromkeys((*InstancePayload.model_fields, *SUBCLASS_STATE))
    if name not in NOT_STORED
)
COLUMN_OF: dict[str, str] = {name: RENAMED.get(name, name) for name in PAYLOAD_FIELDS}

InstanceRow = dict[str, Any]


def plain(obj: VersionedObject) -> dict[str, Any]:
    """An object's field values without the versioned wire wrapper (what JSON columns hold)."""
    return {name: getattr(obj, name) for name in type(obj).model_fields}


def flavor_columns(flavor: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flavor's copies kept in columns, for filters and sorts."""
    flavor = flavor or {}
    return {
        "flavor_id": flavor.get("flavorid"),
        "flavor_name": flavor.get("name"),
        "memory_mb": flavor.get("memory_mb"),
        "vcpus": flavor.get("vcpus"),
        "root_gb": flavor.get("root_gb"),
        "ephemeral_gb": flavor.get("ephemeral_gb"),
    }


def payload_to_row(payload: InstancePayload) -> InstanceRow:
    """The ``instances`` row of a snapshot (without ``id``)."""
    row: InstanceRow = {}
    for name in PAYLOAD_FIELDS:
        value = getattr(payload, name, None)
        if name in NESTED_ONE and value is not None:
            value = plain(value)
        elif name in NESTED_MANY and value is not None:
            value = [plain(item) for item in value]
        row[COLUMN_OF[name]] = value
    row.update(flavor_columns(row["flavor"]))
    row["locked"] = bool(row["locked"])
    row["revision"] = payload.revision if payload.revision is not None else 1
    row["forthcoming"] = bool(payload.forthcoming)
    row["deleted"] = payload.state == "deleted"
    return row


def row_to_payload(
    row: Mapping[str, Any],
    cell_uuid: str | None,
    cls: type[P] = InstanceActionPayload,  # type: ignore[assignment]
    **event_fields: Any,
) -> P:
    """The snapshot of a row as ``cls`` (any ``InstancePayload`` class).

    ``event_fields`` sets the fields of one event (``state_update``, ``fault``, …).
    Subclass fields ``cls`` lacks (``keypairs`` on an action payload, …) are left out:
    the payload classes allow extra fields and would otherwise carry them onto the
    wire. ``tags`` is on every class: Cellsight sends them with every event.
    """
    fields = cls.model_fields
    data: dict[str, Any] = {}
    for name in PAYLOAD_FIELDS:
        if name not in fields:
            continue
        value = row.get(COLUMN_OF[name])
        if value is None and name in ("metadata", "ip_addresses", "tags", "keypairs"):
            continue  # the class's default (empty) for a NULL column
        data[name] = value
    data["cell_uuid"] = cell_uuid
    data["revision"] = row.get("revision")
    data["forthcoming"] = bool(row.get("forthcoming"))
    data.update(event_fields)
    return cls.model_validate(data, context={AS_STORED: True})


def action_payload(row: Mapping[str, Any], cell_uuid: str | None) -> InstanceActionPayload:
    return row_to_payload(row, cell_uuid, InstanceActionPayload)


def create_payload(row: Mapping[str, Any], cell_uuid: str | None) -> InstanceCreatePayload:
    return row_to_payload(row, cell_uuid, InstanceCreatePayload)


def update_payload(
    row: Mapping[str, Any], cell_uuid: str | None, **event_fields: Any
) -> InstanceUpdatePayload:
    return row_to_payload(row, cell_uuid, InstanceUpdatePayload, **event_fields)


def node_to_payload(row: Mapping[str, Any], cell_uuid: str | None) -> ComputeNodePayload:
    fields = ComputeNodePayload.model_fields
    data = {name: row[name] for name in fields if name in row and name != "cell_uuid"}
    return ComputeNodePayload.model_validate({**data, "cell_uuid": cell_uuid})
