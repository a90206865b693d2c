"""Documents → query2 data rows of ``[status, value]``, Ganeti's result statuses.

* 0 normal: the value.
* 1 unknown field: the name is not in the registry (its definition says ``unknown``).
* 2 no data: the item's source did not answer (an instance whose cell was skipped on
  the fan-out path: only what its instance mapping says is known).
* 3 unavailable: the item has no value for this field: not known yet (a forthcoming
  instance has no host, node, launch time, ...) or not applicable (``terminated_at`` of
  a live instance, ``task_state`` with no task running). A null is never status 0, so a
  client can tell "no value" from a value.
* 4 offline: a live resource value of something on an offline node (a node's
  memory/CPU/disk figures; an instance's power state, which only that node knows).

A non-normal status always has the value ``null``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

from cellsight.api.query2.fields import REGISTRY, FieldDef, QKind
from cellsight.api.status import status_from_state


class Status(IntEnum):
    NORMAL = 0
    UNKNOWN = 1
    NODATA = 2
    UNAVAIL = 3
    OFFLINE = 4


# What an offline node cannot tell: the node's live figures, its instances' power state.
INSTANCE_LIVE = frozenset({"power_state"})
NODE_LIVE = frozenset(
    f.doc_field for f in REGISTRY["node"].values() if f.kind in (QKind.NUMBER, QKind.UNIT)
)


@dataclass(frozen=True)
class Item:
    """One instance or node to render.

    ``known``: the document fields whose values are known (``None``: all of them);
    the others are "no data". ``offline``: the fields an offline node cannot vouch for.
    """

    doc: Mapping[str, Any]
    known: Collection[str] | None = None
    offline: Collection[str] = frozenset()


def cell(field: FieldDef | None, item: Item) -> list[Any]:
    if field is None:
        return [int(Status.UNKNOWN), None]
    name = field.doc_field
    if item.known is not None and name not in item.known:
        return [int(Status.NODATA), None]
    if name in item.offline:
        return [int(Status.OFFLINE), None]
    if field.computed:  # the instance status, the one computed field
        return [
            int(Status.NORMAL),
            status_from_state(item.doc.get("state"), item.doc.get("task_state")),
        ]
    value = item.doc.get(name)
    if value is None:
        return [int(Status.UNAVAIL), None]
    return [int(Status.NORMAL), _wire(field, value)]


def _wire(field: FieldDef, value: Any) -> Any:
    if field.kind is QKind.TIMESTAMP:
        return epoch_seconds(value)
    return value


# The last second of year 9999 as a double, below it: near 2.5e11 a double's step is
# 2^-14 s, so the last 30 µs of the calendar round up to year 10000, which no client's
# datetime reads and which this API's own filters refuse.
LAST_SECONDS = math.nextafter(datetime.max.replace(tzinfo=UTC).timestamp(), 0.0)


def epoch_seconds(value: Any) -> float:
    """Ganeti's timestamp value: seconds since the epoch, fraction included."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return min(value.timestamp(), LAST_SECONDS)
    return float(value)


def render(resource: str, names: Sequence[str], items: Sequence[Item]) -> list[list[list[Any]]]:
    fields = [REGISTRY[resource].get(name) for name in names]
    return [[cell(field, item) for field in fields] for item in items]
