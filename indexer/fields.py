"""The document field registry, derived from the payload objects.

Every scalar field of ``InstancePayload`` (and ``ComputeNodePayload``) becomes a document
field whose kind follows its Python type; nested Nova objects are flattened where the
API filters or sorts on them (flavor) and stored verbatim where it only returns them
(addresses, block devices). The engine mappings, the embedded engine's columns and
(later) the API's field registry are all generated from these lists.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from cellsight.notifications.base import VersionedObject
from cellsight.notifications.objects import ComputeNodePayload
from cellsight.notifications.payloads import InstancePayload
from cellsight.query.fields import DocField, Kind

# Names a person searches by words as well as exactly.
TEXT_FIELDS = frozenset({"display_name", "display_description", "host_name"})
# Nested objects kept whole for the detail view.
OBJECT_FIELDS = frozenset(
    {"ip_addresses", "block_devices", "metadata", "shares", "flavor_extra_specs"}
)
# Payload fields that are not part of the instance's state.
EVENT_ONLY_FIELDS = frozenset(
    {"request_id", "action_initiator_project", "action_initiator_user", "revision"}
)


def _unoptional(annotation: Any) -> tuple[Any, bool]:
    """The inner type of ``X | None`` and whether it is a list."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0]
        origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
        origin = typing.get_origin(annotation)
    if origin is list:
        return typing.get_args(annotation)[0], True
    return annotation, False


def _kind_of(name: str, annotation: Any) -> tuple[Kind, bool]:
    inner, many = _unoptional(annotation)
    if name in TEXT_FIELDS:
        return Kind.TEXT, many
    if name in OBJECT_FIELDS or typing.get_origin(inner) is dict:
        return Kind.OBJECT, many
    if isinstance(inner, type) and issubclass(inner, VersionedObject):
        return Kind.OBJECT, many
    if inner is bool:
        return Kind.BOOLEAN, many
    if inner is int:
        return Kind.LONG, many
    if inner is float:
        return Kind.DOUBLE, many
    if inner is datetime:
        return Kind.DATE, many
    return Kind.KEYWORD, many


def fields_of(model: type[VersionedObject], skip: frozenset[str] = frozenset()) -> list[DocField]:
    out = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        kind, many = _kind_of(name, info.annotation)
        out.append(DocField(name, kind, many, info.description or ""))
    return out


def _flavor_fields() -> list[DocField]:
    from cellsight.notifications.payloads import FlavorPayload

    return [
        DocField(f"flavor_{f.name}", f.kind, f.many)
        for f in fields_of(
            FlavorPayload, skip=frozenset({"projects", "description", "disabled", "is_public"})
        )
    ]


# Fields no document lacks. ``uuid`` is the document's id (the payload requires it);
# ``created_at`` is set when Nova creates the instance row (oslo.db's TimestampMixin
# default), before the first notification about it, and the cells set it on create
# (``cellsight.cells.instances``). Declaring a field here is a promise about the data: a keyset
# page after a value of it leaves out documents without one (see ``tree.after``).
NEVER_NULL: dict[str, frozenset[str]] = {
    "instance": frozenset({"uuid", "created_at"}),
    "node": frozenset({"uuid"}),
}


def _never_null(fields: list[DocField], names: Collection[str]) -> list[DocField]:
    return [replace(f, never_null=True) if f.name in names else f for f in fields]


# Fields every document has besides the payload's: maintained by the indexer.
BOOKKEEPING_FIELDS = [
    DocField("cell_uuid", Kind.KEYWORD),
    DocField("forthcoming", Kind.BOOLEAN),
    DocField("deleted", Kind.BOOLEAN),
    DocField("tags", Kind.KEYWORD, many=True),
    # The version of the event the tags came from. Nova's action payloads carry no tags,
    # so a document may hold tags older than itself; an older event that did carry tags,
    # arriving after it, still replaces them (``cellsight.indexer.retag``).
    DocField("tags_version", Kind.LONG),
    DocField("ip4", Kind.KEYWORD, many=True),
    DocField("ip6", Kind.KEYWORD, many=True),
    DocField("version", Kind.LONG),
    DocField("event_type", Kind.KEYWORD),
    DocField("indexed_at", Kind.DATE),
]

INSTANCE_FIELDS: list[DocField] = _never_null(
    [
        *fields_of(
            InstancePayload,
            skip=EVENT_ONLY_FIELDS | {"flavor", "cell_uuid", "forthcoming", "tags"},
        ),
        *_flavor_fields(),
        *BOOKKEEPING_FIELDS,
    ],
    NEVER_NULL["instance"],
)

NODE_FIELDS: list[DocField] = _never_null(
    [
        *fields_of(ComputeNodePayload, skip=frozenset({"revision"})),
        DocField("version", Kind.LONG),
        DocField("indexed_at", Kind.DATE),
    ],
    NEVER_NULL["node"],
)

FIELDS_BY_RESOURCE: dict[str, list[DocField]] = {"instance": INSTANCE_FIELDS, "node": NODE_FIELDS}


def field_map(resource: str) -> dict[str, DocField]:
    return {f.name: f for f in FIELDS_BY_RESOURCE[resource]}


# Lucene refuses terms over 32766 bytes; 8191 characters of up to 4 UTF-8 bytes fit.
# A longer value would be stored but not indexed, so filters and sorts on it would
# disagree with the SQL paths, which see every value.
KEYWORD_IGNORE_ABOVE = 8191


def search_mapping(resource: str) -> dict[str, Any]:
    """The Elasticsearch/OpenSearch mapping; ``strict`` so a stray field cannot widen it.

    Dates are ``date_nanos``, not ``date``: documents carry microseconds, and ``date``
    keeps milliseconds, so instants 1 µs apart would compare equal and sort as ties in
    the index while the SQL paths (cells, embedded) tell them apart. The price is
    ``date_nanos``'s range, 1970 to 2262, which every instance timestamp is in.
    """
    props: dict[str, Any] = {}
    for f in FIELDS_BY_RESOURCE[resource]:
        if f.kind is Kind.TEXT:
            props[f.name] = {
                "type": "text",
                "fields": {"raw": {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}},
            }
        elif f.kind is Kind.OBJECT:
            props[f.name] = {"type": "object", "enabled": False}
        elif f.kind is Kind.KEYWORD:
            props[f.name] = {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}
        elif f.kind is Kind.DATE:
            props[f.name] = {"type": "date_nanos"}
        else:
            props[f.name] = {"type": f.kind.value}
    return {"dynamic": "strict", "properties": props}


def values_of(
    getter: Callable[..., Callable[[Any], Any]], names: Sequence[str]
) -> Callable[[Any], tuple[Any, ...]]:
    """``getter(*names)`` (``attrgetter`` or ``itemgetter``: one C call for all of them)
    answering a tuple for any number of names; those answer a bare value for one name
    and cannot be made for none."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = getter(names[0])
        return lambda obj: (one(obj),)
    return getter(*names)
