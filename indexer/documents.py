"""Payload → document, and the external version rule. Pure functions.

Version rule (documented in the README):

* A payload from Cellsight's producer carries ``revision``, the cell row's counter that
  every committed change bumps; the version is that revision. Events of one revision
  describe the same committed row, so whichever of them lands first is the state.
* Otherwise (Nova's own payloads) the version is derived from the newest of the
  snapshot's timestamps (``updated_at``, ``deleted_at``, ``terminated_at``,
  ``launched_at``, ``created_at``) at microsecond precision, shifted left by 10 bits;
  the low 10 bits break ties deterministically: 2 bits of phase (start < none/progress
  < error < end) then 8 bits of how many milliseconds after that timestamp the event
  was emitted (capped at 255). Limits: events of one instance within the same
  microsecond, same phase and same emission millisecond are ordered by arrival; the
  scheme is good until 2^53 µs after 1970 (year 2255), with no wraparound.
* The two rules are never mixed for one deployment (a revision is far smaller than a
  time-derived version).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from cellsight.indexer.fields import BOOKKEEPING_FIELDS, INSTANCE_FIELDS, NODE_FIELDS, Kind
from cellsight.notifications.base import DATA, VersionedObject, format_timestamp
from cellsight.notifications.envelope import EventType
from cellsight.notifications.objects import ComputeNodePayload
from cellsight.notifications.payloads import InstancePayload

TIE_BITS = 10
_PHASE_RANK = {"start": 0, None: 1, "progress": 1, "error": 2, "end": 3}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_PAYLOAD_INSTANCE_FIELDS = [
    f
    for f in INSTANCE_FIELDS
    if f.name in InstancePayload.model_fields and f not in BOOKKEEPING_FIELDS
]
_FLAVOR_FIELDS = [f for f in INSTANCE_FIELDS if f.name.startswith("flavor_")]


_MICROSECOND = timedelta(microseconds=1)


def _micros(value: datetime) -> int:
    return max(0, (value - _EPOCH) // _MICROSECOND)


def snapshot_time(payload: InstancePayload) -> datetime | None:
    # filter(None, ...) drops only the Nones: a datetime is always true.
    times = (
        payload.updated_at,
        payload.deleted_at,
        payload.terminated_at,
        payload.launched_at,
        payload.created_at,
    )
    return max(filter(None, times), default=None)


def event_version(payload: InstancePayload, event: EventType, emitted_at: datetime | None) -> int:
    """The external version of one event's snapshot (see the module docstring)."""
    return version_of(payload.revision, snapshot_time(payload), event, emitted_at)


def version_of(
    revision: int | None, snapshot: datetime | None, event: EventType, emitted_at: datetime | None
) -> int:
    """``event_version`` from the payload's revision and ``snapshot_time``, for a caller
    that needs the snapshot time too (computed once)."""
    if revision is not None:
        return revision
    base = snapshot or emitted_at or _EPOCH
    after_ms = 0
    if emitted_at is not None:
        after_ms = min(255, max(0, int((emitted_at - base).total_seconds() * 1000)))
    tie = (_PHASE_RANK.get(event.phase, 1) << 8) | after_ms
    return (_micros(base) << TIE_BITS) | tie


def is_deleted(payload: InstancePayload, event: EventType) -> bool:
    return (
        payload.deleted_at is not None
        or payload.state == "deleted"
        or (event.action == "delete" and event.phase == "end")
    )


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, VersionedObject):
        return value.to_primitive()[DATA]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def split_ips(addresses: Iterable[Any]) -> tuple[list[str], list[str]]:
    """The addresses by version, which the address tells (``forms.address_version``),
    as the API renders it; the payload's own ``version`` is not read."""
    ip4: list[str] = []
    ip6: list[str] = []
    for ip in addresses:
        if ip.address:
            (ip6 if ":" in ip.address else ip4).append(ip.address)
    return ip4, ip6


def instance_document(
    payload: InstancePayload,
    event_type: str,
    version: int,
    cell_uuid: str | None = None,
) -> dict[str, Any]:
    """The instance document. ``tags`` (and ``tags_version``) are absent when the
    payload did not carry them (Nova's action payloads), so the writer keeps the stored
    tags."""
    event = EventType.parse(event_type)
    doc: dict[str, Any] = {
        f.name: _plain(getattr(payload, f.name)) for f in _PAYLOAD_INSTANCE_FIELDS
    }
    flavor = payload.flavor
    for f in _FLAVOR_FIELDS:
        doc[f.name] = (
            _plain(getattr(flavor, f.name[len("flavor_") :])) if flavor is not None else None
        )
    doc["ip4"], doc["ip6"] = split_ips(payload.ip_addresses)
    doc["cell_uuid"] = payload.cell_uuid or cell_uuid
    doc["forthcoming"] = bool(payload.forthcoming)
    doc["deleted"] = is_deleted(payload, event)
    if doc["deleted"] and doc["state"] != "deleted":
        doc["state"] = "deleted"
    if payload.tags is not None:
        doc["tags"] = list(payload.tags)
        doc["tags_version"] = version
    doc["version"] = version
    doc["event_type"] = event_type
    doc["indexed_at"] = format_timestamp(datetime.now(UTC))
    return doc


def node_version(payload: ComputeNodePayload) -> int:
    """The node row's revision (required by the contract: a node's versions are on one
    scale, so that ``index verify`` compares them with the rows')."""
    return payload.revision


def node_document(payload: ComputeNodePayload, version: int) -> dict[str, Any]:
    doc = {
        f.name: _plain(getattr(payload, f.name))
        for f in NODE_FIELDS
        if f.name in ComputeNodePayload.model_fields
    }
    doc["version"] = version
    doc["indexed_at"] = format_timestamp(datetime.now(UTC))
    return doc


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """A document without the fields that record how (not what) it was written."""
    return {k: v for k, v in doc.items() if k not in ("event_type", "indexed_at")}


DATE_FIELDS = frozenset(f.name for f in INSTANCE_FIELDS if f.kind is Kind.DATE)
