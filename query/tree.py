"""The filter tree and the total sort order. Pure data; compilers live beside it.

Semantics, defined once for every path:

* Values are compared as the document holds them (``cellsight.indexer.documents``): keyword and
  text fields as strings (code-point order), dates as UTC instants, longs/doubles as
  numbers, booleans as booleans.
* A missing value (null, or an empty multi-valued field) matches no comparison, no
  regex and no ``Contains``; ``Exists`` is false for it.
* On multi-valued fields (tags, ip4, ip6) a comparison or regex is true when any element
  matches; ``Contains`` is exact membership.
* Regexes are a portable, unanchored subset (see ``regex.py``), matched case-sensitively.
* Sorting: null is the smallest value (first when ascending, last when descending);
  every order ends with ``uuid`` ascending, so the order is total and a keyset
  (``After``) pages without skipping or repeating.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

Scalar = str | int | float | bool | datetime | None


class Op(StrEnum):
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


@dataclass(frozen=True)
class Compare:
    field: str
    op: Op
    value: Scalar  # never None: use Exists / Not(Exists) for null checks


@dataclass(frozen=True)
class In:
    field: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class Regex:
    field: str
    pattern: str  # validated portable subset, unanchored unless it says ^ / $


@dataclass(frozen=True)
class Contains:
    field: str  # a multi-valued field
    value: Scalar


@dataclass(frozen=True)
class Exists:
    field: str


@dataclass(frozen=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    child: Node


@dataclass(frozen=True)
class MatchAll:
    pass


@dataclass(frozen=True)
class MatchNone:
    pass


Node = Compare | In | Regex | Contains | Exists | And | Or | Not | MatchAll | MatchNone


class Direction(StrEnum):
    ASC = "asc"
    DESC = "desc"


@dataclass(frozen=True)
class SortKey:
    field: str
    direction: Direction = Direction.ASC


def total_order(keys: tuple[SortKey, ...]) -> tuple[SortKey, ...]:
    """The requested keys, then ``uuid`` ascending unless already present."""
    if any(k.field == "uuid" for k in keys):
        # uuid is unique: nothing after it can matter.
        cut = next(i for i, k in enumerate(keys) if k.field == "uuid")
        return keys[: cut + 1]
    return (*keys, SortKey("uuid", Direction.ASC))


def after(
    order: tuple[SortKey, ...], values: tuple[Scalar, ...], never_null: Collection[str] = ()
) -> Node:
    """Rows strictly after the row whose sort values are ``values`` (a keyset).

    Expanded to plain comparisons so every compiler handles it, nulls included:
    OR over i of (keys before i equal) AND (key i after value i).

    That OR alone is no range on any key, so a SQL planner cannot seek an index to the
    marker: SQLite either scans the sort index from the top (a cost growing with the
    page number) or unions the branches and sorts everything after the marker (seconds
    at a million rows). So when the first key's position can be stated as one plain
    comparison, it is added in front: every row after the keyset has its first key at
    or beyond the marker's, so the bound is redundant (the results are the same with or
    without it) and lets an index on that key range-scan from the marker. Ascending (nulls
    first), after a value: ``key >= value``. Descending (nulls last), after a value:
    ``key <= value OR key is null``, a plain range only when the key can never be null
    (``never_null``, from the field registry); otherwise no bound. After a null there is
    nothing to bound: ascending, every row is at or beyond it; descending, the branches
    already are ``key is null AND ...``.
    """
    assert len(order) == len(values)
    branches: list[Node] = []
    for i, (key, value) in enumerate(zip(order, values, strict=True)):
        equal_prefix = [_equal(k.field, v) for k, v in zip(order[:i], values[:i], strict=True)]
        branches.append(_and(*equal_prefix, _beyond(key, value)))
    keyset = _or(*branches)
    if not order or values[0] is None or isinstance(keyset, MatchAll | MatchNone):
        return keyset
    first = order[0]
    if first.direction is Direction.ASC:
        return _and(Compare(first.field, Op.GE, values[0]), keyset)
    if first.field in never_null:
        return _and(Compare(first.field, Op.LE, values[0]), keyset)
    return keyset


def _equal(field: str, value: Scalar) -> Node:
    return Not(Exists(field)) if value is None else Compare(field, Op.EQ, value)


def _beyond(key: SortKey, value: Scalar) -> Node:
    if key.direction is Direction.ASC:
        # nulls first: everything non-null is after a null
        return Exists(key.field) if value is None else Compare(key.field, Op.GT, value)
    # descending, nulls last: nothing is after a null; nulls are after any value
    if value is None:
        return MatchNone()
    return _or(Compare(key.field, Op.LT, value), Not(Exists(key.field)))


def _and(*nodes: Node) -> Node:
    flat = [n for n in nodes if not isinstance(n, MatchAll)]
    if any(isinstance(n, MatchNone) for n in flat):
        return MatchNone()
    if not flat:
        return MatchAll()
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def _or(*nodes: Node) -> Node:
    flat = [n for n in nodes if not isinstance(n, MatchNone)]
    if any(isinstance(n, MatchAll) for n in flat):
        return MatchAll()
    if not flat:
        return MatchNone()
    return flat[0] if len(flat) == 1 else Or(tuple(flat))


def conjunction(*nodes: Node) -> Node:
    return _and(*nodes)


def disjunction(*nodes: Node) -> Node:
    return _or(*nodes)


@dataclass(frozen=True)
class SearchRequest:
    """One page of a resource: the filter, the total order, the page size, and an
    optional keyset start (``after``) in the same order."""

    filter: Node
    order: tuple[SortKey, ...]
    limit: int
    after: tuple[Scalar, ...] | None = None

    def effective_filter(self) -> Node:
        if self.after is None:
            return self.filter
        return conjunction(self.filter, after(self.order, self.after))
