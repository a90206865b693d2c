"""Payload → document in one pass, from the compiled decoder's Structs.

The same document as ``cellsight.indexer.documents.instance_document``/``node_document`` builds
from the pydantic models (tested differentially), with the field lists, the version
rule and the deletion rule taken from there; only the reading differs: one
``attrgetter`` for the plain fields, no model dump, nested objects copied once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

import msgspec

from cellsight.indexer.documents import (
    _FLAVOR_FIELDS,
    _PAYLOAD_INSTANCE_FIELDS,
    is_deleted,
    node_version,
    snapshot_time,
    version_of,
)
from cellsight.indexer.fields import NODE_FIELDS, DocField, Kind, values_of
from cellsight.notifications.fastdecode import FastNotification
from cellsight.notifications.objects import ComputeNodePayload


def _split(fields: list[DocField]) -> tuple[list[str], list[str], list[str]]:
    """Field names as (plain, times, lists of nested objects), from the registry's kinds."""
    times = [f.name for f in fields if f.kind is Kind.DATE]
    objects = [f.name for f in fields if f.kind is Kind.OBJECT and f.many]
    plain = [f.name for f in fields if f.name not in times and f.name not in objects]
    return plain, times, objects


_I_PLAIN, _I_TIMES, _I_OBJECTS = _split(_PAYLOAD_INSTANCE_FIELDS)
_get_plain = values_of(attrgetter, _I_PLAIN)
_FLAVOR = [(f.name, f.name[len("flavor_") :]) for f in _FLAVOR_FIELDS]
_get_flavor = values_of(attrgetter, [attr for _, attr in _FLAVOR])
_FLAVOR_NAMES = [name for name, _ in _FLAVOR]
_FLAVOR_NONE = dict.fromkeys(_FLAVOR_NAMES)

_N_PLAIN, _N_TIMES, _N_OBJECTS = _split(
    [f for f in NODE_FIELDS if f.name in ComputeNodePayload.model_fields]
)
_get_node_plain = values_of(attrgetter, _N_PLAIN)


_get_times = values_of(attrgetter, _I_TIMES)
_get_node_times = values_of(attrgetter, _N_TIMES)


_TEMPLATE: dict[str, Any] = dict.fromkeys(
    [*_I_PLAIN, *_I_TIMES, *_I_OBJECTS, *_FLAVOR_NAMES, "ip4", "ip6", "cell_uuid",
     "forthcoming", "deleted", "version", "event_type", "indexed_at"]
)  # fmt: skip


def now() -> str:
    """``indexed_at``: the planner stamps a whole batch with one reading of the clock."""
    stamp: str = msgspec.to_builtins(datetime.now(UTC))
    return stamp


def instance_document(
    n: FastNotification, version: int, indexed_at: str | None = None
) -> dict[str, Any]:
    data = n.data
    # Copied from a template holding every key, so the dict never grows (no rehashing).
    doc = _TEMPLATE.copy()
    # zip without ``strict`` here: each getter answers as many values as its names, and
    # the keyword costs a call 500 instructions of argument parsing (callgrind).
    doc.update(zip(_I_PLAIN, _get_plain(data)))  # noqa: B905
    # Times are UTC already (the decoder normalised them); msgspec writes them in the
    # wire form (``Z``, microseconds only when present) in one call.
    doc.update(zip(_I_TIMES, msgspec.to_builtins(_get_times(data))))  # noqa: B905
    for name in _I_OBJECTS:
        value = getattr(data, name)
        doc[name] = None if value is None else [msgspec.to_builtins(w.data) for w in value]
    flavor = data.flavor
    if flavor is None:
        doc.update(_FLAVOR_NONE)
    else:
        doc.update(zip(_FLAVOR_NAMES, _get_flavor(flavor.data)))  # noqa: B905
    ip4: list[str] = []
    ip6: list[str] = []
    for wire in data.ip_addresses:
        ip = wire.data
        if ip.address:
            (ip6 if ":" in ip.address else ip4).append(ip.address)
    doc["ip4"], doc["ip6"] = ip4, ip6
    doc["cell_uuid"] = data.cell_uuid or None  # "" is no cell, as in documents.py
    doc["forthcoming"] = bool(data.forthcoming)
    doc["deleted"] = is_deleted(data, n.event)
    if doc["deleted"] and doc["state"] != "deleted":
        doc["state"] = "deleted"
    if data.tags is not None:
        doc["tags"] = list(data.tags)
        doc["tags_version"] = version
    doc["version"] = version
    doc["event_type"] = n.event_type
    doc["indexed_at"] = indexed_at or now()
    return doc


def instance_version(n: FastNotification) -> tuple[int, datetime | None]:
    """The document's version and the snapshot time it derives from (read once)."""
    snapshot = snapshot_time(n.data)
    return version_of(n.data.revision, snapshot, n.event, n.timestamp), snapshot


def node_document(n: FastNotification, indexed_at: str | None = None) -> tuple[int, dict[str, Any]]:
    data = n.data
    version = node_version(data)
    doc = dict(zip(_N_PLAIN, _get_node_plain(data), strict=True))
    doc.update(zip(_N_TIMES, msgspec.to_builtins(_get_node_times(data)), strict=True))
    doc["version"] = version
    doc["indexed_at"] = indexed_at or now()
    return version, doc
