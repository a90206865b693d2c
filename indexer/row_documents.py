"""Cell rows → index documents, for bulk sync and anti-entropy repairs.

``reference_document`` is the definition: the row's snapshot as a payload
(``cellsight.cells.rows.row_to_payload``) mapped by
``cellsight.indexer.documents.instance_document``, the very functions a notification
of that row goes through, with the row's ``revision`` as the external version. A
document a sync writes therefore equals the one a live notification of the same
revision writes (``cellsight.indexer.documents.comparable``).

A million rows through pydantic costs minutes, so ``FastInstanceDocs`` builds the same
document straight from the driver's raw values (no SQLAlchemy result processing, no
payload objects). Its field plan is derived from the payload models, and it accepts
only values of exactly the expected type; anything else (an unexpected type, a field
kind it does not know, a wrapped nested object, a year before 1000) raises
``NeedsReference`` and the caller re-reads that row typed and uses the reference.
Tests hold the fast path equal to the reference on every dialect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from cellsight.cells.rows import COLUMN_OF, node_to_payload, row_to_payload
from cellsight.cells.schema import instances
from cellsight.indexer.documents import instance_document, node_document, node_version
from cellsight.indexer.engines.base import StoredDocument, WriteOp
from cellsight.indexer.fields import BOOKKEEPING_FIELDS, INSTANCE_FIELDS
from cellsight.indexer.row_values import (
    Convert,
    NeedsReference,
    copy_default,
    from_json,
    getter,
    object_converter,
    plan,
    to_bool,
)
from cellsight.notifications.base import format_timestamp
from cellsight.notifications.payloads import FlavorPayload, InstancePayload, InstanceUpdatePayload

SYNC_EVENT = "instance.sync"  # event_type of documents a sync wrote (how, not what)
REPAIR_EVENT = "instance.repair"  # ... and of those ``index verify --repair`` rewrote

# row_to_payload leaves these out when NULL, so the payload class's default applies.
_DEFAULTED_WHEN_NULL = frozenset({"metadata", "ip_addresses", "tags", "keypairs"})
__all__ = ["REPAIR_EVENT", "SYNC_EVENT", "FastInstanceDocs", "NeedsReference"]


def reference_document(row: Mapping[str, Any], cell_uuid: str, event_type: str) -> dict[str, Any]:
    """The instance document of a typed row (as ``cellsight.cells.reads`` returns it)."""
    # InstanceUpdatePayload: its tags default to [] when the column is NULL, where an
    # action payload would leave them unknown (and the writer would keep stored ones).
    payload = row_to_payload(row, cell_uuid, InstanceUpdatePayload)
    return instance_document(payload, event_type, int(row["revision"]), cell_uuid)


def node_row_document(row: Mapping[str, Any], cell_uuid: str) -> dict[str, Any]:
    payload = node_to_payload(row, cell_uuid)
    return node_document(payload, node_version(payload))


# The document --------------------------------------------------------------------------
_DOC_FIELDS = [
    f.name
    for f in INSTANCE_FIELDS
    if f.name in InstancePayload.model_fields and f not in BOOKKEEPING_FIELDS
]
_FLAVOR_DOC_FIELDS = [f.name for f in INSTANCE_FIELDS if f.name.startswith("flavor_")]
_JSON_COLUMNS = frozenset(c.name for c in instances.c if isinstance(c.type, sa.JSON))


def _plan_field(name: str) -> tuple[Convert, frozenset[type] | None]:
    """The converter of a top-level field's raw column value, and the types that pass
    through it unchanged (None: it always converts)."""
    info = InstanceUpdatePayload.model_fields[name]
    p = plan(info.annotation, info.metadata)
    convert, same = p.convert, p.same
    if same is not None and bool in same:
        same, checked = None, convert  # raw 0/1 from SQLite and MariaDB

        def convert(value: Any) -> Any:
            return checked(to_bool(value))

    if COLUMN_OF[name] in _JSON_COLUMNS:
        # One closure, not a chain: this runs for five columns of every row.
        same, parsed = None, convert
        defaulted = name in _DEFAULTED_WHEN_NULL
        default = info.get_default(call_default_factory=True)

        def decoded(value: Any) -> Any:
            if type(value) is str:
                value = from_json(value)
            if value is None and defaulted:
                return copy_default(default)
            return parsed(value)

        convert = _memo(decoded)
    return convert, same


def _memo(convert: Convert, size: int = 4096) -> Convert:
    """``convert`` remembered by the column's JSON text: most rows share a handful of
    flavors, tag sets, metadata and empty lists. Each call returns its own copy (of
    the containers), so no two documents share one."""
    seen: dict[str, Any] = {}

    def remembered(value: Any) -> Any:
        if type(value) is not str:
            return convert(value)  # decoded already (psycopg): nothing to key on
        hit = seen.get(value, _MISS)
        if hit is _MISS:
            hit = convert(value)
            if len(seen) < size:
                seen[value] = hit
            else:
                return hit
        return _clone(hit)

    return remembered


_MISS = object()


def _clone(value: Any) -> Any:
    if type(value) is list:
        return [_clone(v) for v in value] if value else []
    if type(value) is dict:
        return {k: _clone(v) for k, v in value.items()} if value else {}
    return value


class FastInstanceDocs:
    """Documents from raw instance rows whose columns are ``columns`` (in order)."""

    def __init__(self, columns: Sequence[str]) -> None:
        at = {name: i for i, name in enumerate(columns)}
        by_types: dict[frozenset[type], list[str]] = {}
        self._others: list[tuple[str, int, Convert]] = []
        for name in _DOC_FIELDS:
            convert, same = _plan_field(name)
            if same is None:
                self._others.append((name, at[COLUMN_OF[name]], convert))
            else:
                by_types.setdefault(same, []).append(name)
        # Pass-through fields (plain strings and integers), checked per group at C speed.
        self._groups = [
            (tuple(names), same, getter([at[COLUMN_OF[n]] for n in names]))
            for same, names in by_types.items()
        ]
        self._flavor_at = at["flavor"]
        # The flavor is validated whole, as the payload would be, then flattened.
        flavor = object_converter(FlavorPayload)
        flat = getter([name[len("flavor_") :] for name in _FLAVOR_DOC_FIELDS])
        self._flavor_names = tuple(_FLAVOR_DOC_FIELDS)
        self._flavor = _memo(lambda value: _flat_flavor(flavor, flat, value))
        self._tags = (at["tags"], _plan_field("tags")[0])
        self._revision_at = at["revision"]
        self._forthcoming_at = at["forthcoming"]
        self.uuid_at = at["uuid"]

    def document(
        self, raw: Sequence[Any], cell_uuid: str, event_type: str, indexed_at: str
    ) -> dict[str, Any]:
        """Raises ``NeedsReference`` for a row the fast path cannot vouch for."""
        doc: dict[str, Any] = {}
        for names, same, get in self._groups:
            values = get(raw)
            if not same.issuperset(map(type, values)):
                raise NeedsReference
            doc.update(zip(names, values, strict=True))
        for name, i, convert in self._others:
            doc[name] = convert(raw[i])
        doc.update(zip(self._flavor_names, self._flavor(raw[self._flavor_at]), strict=True))
        ip4: list[str] = []
        ip6: list[str] = []
        for ip in doc["ip_addresses"]:
            address = ip["address"]
            if address:
                (ip6 if ip["version"] == 6 or ":" in address else ip4).append(address)
        doc["ip4"], doc["ip6"] = ip4, ip6
        doc["cell_uuid"] = cell_uuid
        doc["forthcoming"] = bool(to_bool(raw[self._forthcoming_at]))
        deleted = doc["deleted_at"] is not None or doc["state"] == "deleted"
        doc["deleted"] = deleted
        if deleted:
            doc["state"] = "deleted"
        at, convert = self._tags
        doc["tags"] = list(convert(raw[at]))
        version = raw[self._revision_at]
        if type(version) is not int:
            raise NeedsReference
        doc["version"] = doc["tags_version"] = version
        doc["event_type"] = event_type
        doc["indexed_at"] = indexed_at
        return doc


def _flat_flavor(flavor: Convert, flat: Convert, value: Any) -> list[Any]:
    """The flavor_* document values of a flavor column (a list: ``_memo`` copies it,
    and the ``extra_specs`` dict in it)."""
    value = from_json(value) if type(value) is str else value
    if value is None:
        return [None] * len(_FLAVOR_DOC_FIELDS)
    return list(flat(flavor(value)))


def now_stamp() -> str:
    """``indexed_at`` of one batch: a sync stamps a batch, not each document."""
    return format_timestamp(datetime.now(UTC))


def tombstone(stored: StoredDocument) -> WriteOp:
    """The orphan's document marked deleted, one version above the stored one."""
    stamp = now_stamp()
    version = stored.version + 1
    doc = dict(stored.document)
    doc.update(
        deleted=True,
        state="deleted",
        deleted_at=doc.get("deleted_at") or stamp,
        version=version,
        event_type=REPAIR_EVENT,
        indexed_at=stamp,
    )
    return WriteOp("instance", stored.id, version, doc)
