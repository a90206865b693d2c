"""A small instance data set made to trip query paths up, and a Python oracle of the
tree's semantics (``cellsight.query.tree``) to check every path against.

The data has nulls in host/launched_at/terminated_at/display_name, duplicate sort
values, instants equal and 1 µs apart (within one millisecond), mixed-case, unicode,
digit and trailing-space names, several tags, v4/v6/odd addresses, deleted and
forthcoming instances, and flavors with and without the JSON-only fields.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cmp_to_key, lru_cache
from typing import Any

from cellsight.indexer.documents import instance_document
from cellsight.indexer.fields import Kind, field_map
from cellsight.notifications.payloads import FlavorPayload, InstanceUpdatePayload, IpPayload
from cellsight.query.prepare import coerce
from cellsight.query.regex import to_python
from cellsight.query.tree import (
    And,
    Compare,
    Contains,
    Direction,
    Exists,
    In,
    MatchAll,
    MatchNone,
    Node,
    Not,
    Op,
    Or,
    Regex,
    SortKey,
)

CELL_UUID = "c0ffee00-0000-4000-8000-000000000001"
EVENT = "instance.update"
BASE = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)
NAMES = [
    "web-1", "web-2", "web-10", "Web-1", "WEB", "db", "db ", "db\t", "émile", "Émile",
    "日本-1", "x9", "9x", "", "a.b", "a+b", "under_score", "web-1", None, None,
]  # fmt: skip
HOSTS = ["compute-1", "compute-2", "Compute-10", "cömpute", None]
TAGS = ["prod", "dev", "Prod", "a b", "z", "ünï", "x@y", "1"]
STATES = ["active", "stopped", "error", "building", None]


def _flavor(rng: random.Random) -> FlavorPayload | None:
    if rng.random() < 0.1:
        return None
    return FlavorPayload(
        flavorid=rng.choice(["1", "2", "10", "m1.tiny"]),
        name=rng.choice(["m1.tiny", "m1.small", "M1.large"]),
        memory_mb=rng.choice([512, 2048, 2048, 8192]),
        vcpus=rng.choice([1, 2, 4]),
        root_gb=rng.choice([1, 20, 20]),
        ephemeral_gb=rng.choice([0, 0, 10]),
        swap=rng.choice([0, 512, None]),
        rxtx_factor=rng.choice([1.0, 1.5, None]),
        vcpu_weight=rng.choice([None, 0, 10]),
    )


def _ips(rng: random.Random, i: int) -> list[IpPayload]:
    out = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        kind = rng.random()
        if kind < 0.5:
            address, version = f"10.0.{i % 4}.{rng.randrange(1, 20)}", 4
        elif kind < 0.8:
            address, version = f"fd00::{rng.randrange(1, 30):x}", 6
        elif kind < 0.9:
            address, version = "fe80::1", None  # no version: told apart by its colon
        else:
            address, version = None, 4  # no address: in neither ip4 nor ip6
        out.append(IpPayload(address=address, version=version, label="private"))
    return out


def _instant(rng: random.Random) -> datetime:
    # few distinct seconds, microsecond offsets inside one millisecond: ties and near ties
    return BASE + timedelta(seconds=rng.randrange(0, 5), microseconds=rng.choice([0, 1, 2, 999]))


def payloads(count: int = 60, seed: int = 20240301) -> list[InstanceUpdatePayload]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        created = _instant(rng)
        launched = (
            None if rng.random() < 0.3 else created + timedelta(microseconds=rng.choice([0, 1, 5]))
        )
        deleted = rng.random() < 0.2
        terminated = (
            (launched or created) + timedelta(seconds=1) if deleted or rng.random() < 0.1 else None
        )
        name = NAMES[i % len(NAMES)]
        out.append(
            InstanceUpdatePayload(
                uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                tenant_id=rng.choice(["p1", "p2", "P1"]),
                user_id=rng.choice(["u1", "u2"]),
                display_name=name,
                # A kilobyte in common: MariaDB sorted by the first 1,024 bytes only
                # (``max_sort_length``), and so returned these out of order.
                display_description=None if i % 4 else "D" * 1100 + "cab"[i // 4 % 3],
                host_name=None if name is None else name.lower().replace(" ", "-"),
                host=rng.choice(HOSTS),
                availability_zone=rng.choice(["nova", "az-2", None]),
                flavor=_flavor(rng),
                created_at=created,
                launched_at=launched,
                terminated_at=terminated,
                updated_at=created + timedelta(microseconds=rng.randrange(0, 3)),
                deleted_at=terminated if deleted else None,
                state="deleted" if deleted else rng.choice(STATES),
                power_state=rng.choice(["running", "shutdown", None]),
                progress=rng.choice([None, 0, 50, 100]),
                locked=rng.random() < 0.2,
                ip_addresses=_ips(rng, i),
                tags=rng.sample(TAGS, rng.choice([0, 0, 1, 2, 3])),
                revision=rng.randrange(1, 9) + (2**53 + 1 if i % 7 == 0 else 0),
                forthcoming=rng.random() < 0.15,
                cell_uuid=CELL_UUID,
            )
        )
    return out


def documents(items: Sequence[InstanceUpdatePayload]) -> list[dict[str, Any]]:
    assert all(p.revision is not None for p in items)
    return [instance_document(p, EVENT, p.revision or 0, CELL_UUID) for p in items]


# The oracle ---------------------------------------------------------------------------

FIELDS = field_map("instance")


def _value(field: str, raw: Any) -> Any:
    return None if raw is None else coerce(FIELDS[field], raw)


def _values(doc: Mapping[str, Any], field: str) -> list[Any]:
    raw = doc.get(field)
    items = raw if isinstance(raw, list) else [] if raw is None else [raw]
    return [_value(field, v) for v in items]


@lru_cache(maxsize=512)
def _python(pattern: str) -> re.Pattern[str]:
    return re.compile(to_python(pattern))


_OPS: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: lambda a, b: a == b,
    Op.NE: lambda a, b: a != b,
    Op.LT: lambda a, b: a < b,
    Op.LE: lambda a, b: a <= b,
    Op.GT: lambda a, b: a > b,
    Op.GE: lambda a, b: a >= b,
}


def matches(node: Node, doc: Mapping[str, Any]) -> bool:
    """The tree's semantics in plain Python."""
    if isinstance(node, MatchAll | MatchNone):
        return isinstance(node, MatchAll)
    if isinstance(node, And):
        return all(matches(c, doc) for c in node.children)
    if isinstance(node, Or):
        return any(matches(c, doc) for c in node.children)
    if isinstance(node, Not):
        return not matches(node.child, doc)
    values = _values(doc, node.field)
    if isinstance(node, Exists):
        return bool(values)
    if isinstance(node, Compare):
        target = _value(node.field, node.value)
        return any(_OPS[node.op](v, target) for v in values)
    if isinstance(node, In):
        targets = [_value(node.field, v) for v in node.values]
        return any(v in targets for v in values)
    if isinstance(node, Contains):
        return _value(node.field, node.value) in values
    assert isinstance(node, Regex)
    return any(_python(node.pattern).search(v) is not None for v in values)


def sort_docs(docs: Sequence[Mapping[str, Any]], order: tuple[SortKey, ...]) -> list[Any]:
    """``docs`` in the total order: null smallest, ``order`` already total."""

    def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
        for key in order:
            x, y = _value(key.field, a.get(key.field)), _value(key.field, b.get(key.field))
            if x == y:
                continue
            smaller = x is None or (y is not None and x < y)
            result = -1 if smaller else 1
            return result if key.direction is Direction.ASC else -result
        return 0

    return sorted(docs, key=cmp_to_key(compare))


def kinds() -> dict[str, Kind]:
    return {name: f.kind for name, f in FIELDS.items()}
