"""Checks a tree and an order against a resource's fields and puts every value in one
canonical form, so each compiler starts from the same, already-decided tree.

* Unknown fields, object fields, regexes on non-strings, ``Contains`` on a single-valued
  field, sorts on multi-valued fields: ``QueryError`` naming the field.
* Values by kind: strings (no NUL, no lone surrogate: no database can hold them),
  dates as aware UTC ``datetime`` (ISO 8601 strings accepted, as documents hold them, so
  a keyset marker can be taken straight from a document), longs as ``int`` within 64
  bits, doubles as finite ``float``, booleans as ``bool``.
* Booleans only ever compare for equality afterwards (``<``/``>`` on false < true are
  rewritten), so no engine needs to order booleans inside a filter; comparisons with
  ``""`` (the smallest string) likewise become equality, existence or nothing.
* ``In`` with no values is ``MatchNone``; regex patterns are validated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime

from cellsight.query import regex
from cellsight.query.fields import DocField, Fields, Kind
from cellsight.query.tree import (
    And,
    Compare,
    Contains,
    Exists,
    In,
    MatchAll,
    MatchNone,
    Node,
    Not,
    Op,
    Or,
    Regex,
    Scalar,
    SearchRequest,
    SortKey,
    after,
    conjunction,
    disjunction,
    total_order,
)

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
STRING_KINDS = (Kind.KEYWORD, Kind.TEXT, Kind.IP)


class QueryError(ValueError):
    """The tree or order does not fit the resource's fields; the message says how."""


def _field(fields: Mapping[str, DocField], name: str) -> DocField:
    f = fields.get(name)
    if f is None:
        raise QueryError(f"unknown field {name!r}")
    if f.kind is Kind.OBJECT:
        raise QueryError(f"field {name!r} is an object: it can be returned, not searched")
    return f


def encodable(text: str) -> bool:
    """Whether UTF-8 can hold ``text``: JSON's ``\\ud800`` escape makes a lone surrogate,
    which no database or engine can store (each layer refuses it with its own error)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def coerce(f: DocField, value: Scalar) -> Scalar:
    """``value`` in the canonical form of ``f``'s kind, or ``QueryError``."""
    kind = f.kind
    if value is None:
        raise QueryError(f"field {f.name!r}: null is not a value (test existence instead)")
    if kind in STRING_KINDS:
        if isinstance(value, str):
            if "\x00" in value:
                raise QueryError(f"field {f.name!r}: a value cannot contain NUL")
            if not encodable(value):
                raise QueryError(f"field {f.name!r}: a value is not valid Unicode")
            return value
    elif kind is Kind.DATE:
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                raise QueryError(f"field {f.name!r}: {value!r} is not a timestamp") from None
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    elif kind is Kind.LONG:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if LONG_MIN <= value <= LONG_MAX:
                return value
            raise QueryError(f"field {f.name!r}: {value} is out of the 64-bit range")
    elif kind is Kind.DOUBLE:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and math.isfinite(value):  # type: ignore[arg-type]
            return float(value)  # type: ignore[arg-type]
    elif kind is Kind.BOOLEAN and isinstance(value, bool):
        return value
    raise QueryError(f"field {f.name!r} of kind {kind.value} cannot take {value!r:.60}")


def _boolean(field: str, op: Op, value: bool) -> Node:
    """A comparison on a boolean as equality tests (false < true)."""
    is_true, is_false = Compare(field, Op.EQ, True), Compare(field, Op.EQ, False)
    table: dict[tuple[Op, bool], Node] = {
        (Op.EQ, True): is_true,
        (Op.EQ, False): is_false,
        (Op.NE, True): is_false,
        (Op.NE, False): is_true,
        (Op.LT, True): is_false,
        (Op.LT, False): MatchNone(),
        (Op.LE, True): Exists(field),
        (Op.LE, False): is_false,
        (Op.GT, True): MatchNone(),
        (Op.GT, False): is_true,
        (Op.GE, True): is_true,
        (Op.GE, False): Exists(field),
    }
    return table[(op, value)]


def _empty_string(field: str, op: Op) -> Node:
    """A comparison with "", the smallest string, without an empty range bound: osmem
    reads ``{"lt": ""}`` as no bound at all (and a bound that matches nothing or one
    value is clearer as what it means on every path anyway)."""
    table: dict[Op, Node] = {
        Op.EQ: Compare(field, Op.EQ, ""),
        Op.NE: Compare(field, Op.GT, ""),
        Op.LT: MatchNone(),
        Op.LE: Compare(field, Op.EQ, ""),
        Op.GT: Compare(field, Op.GT, ""),
        Op.GE: Exists(field),
    }
    return table[op]


def prepare_filter(node: Node, fields: Mapping[str, DocField]) -> Node:
    if isinstance(node, MatchAll | MatchNone):
        return node
    if isinstance(node, And):
        return conjunction(*(prepare_filter(c, fields) for c in node.children))
    if isinstance(node, Or):
        return disjunction(*(prepare_filter(c, fields) for c in node.children))
    if isinstance(node, Not):
        child = prepare_filter(node.child, fields)
        if isinstance(child, MatchAll | MatchNone):
            return MatchNone() if isinstance(child, MatchAll) else MatchAll()
        return Not(child)
    f = _field(fields, node.field)
    if isinstance(node, Exists):
        return node
    if isinstance(node, Compare):
        value = coerce(f, node.value)
        if f.kind is Kind.BOOLEAN:
            assert isinstance(value, bool)
            return _boolean(f.name, Op(node.op), value)
        if value == "" and f.kind in STRING_KINDS:
            return _empty_string(f.name, Op(node.op))
        return Compare(f.name, Op(node.op), value)
    if isinstance(node, In):
        values = tuple(dict.fromkeys(coerce(f, v) for v in node.values))
        return In(f.name, values) if values else MatchNone()
    if isinstance(node, Regex):
        if f.kind not in STRING_KINDS:
            raise QueryError(f"field {f.name!r} is not a string: regexes need one")
        try:
            return Regex(f.name, regex.validate(node.pattern))
        except regex.InvalidRegex as exc:
            raise QueryError(str(exc)) from exc
    if isinstance(node, Contains):
        if not f.many:
            raise QueryError(f"field {f.name!r} has one value: use == instead of contains")
        return Contains(f.name, coerce(f, node.value))
    raise QueryError(f"not a filter node: {node!r:.80}")


def prepare_order(
    order: tuple[SortKey, ...], fields: Mapping[str, DocField]
) -> tuple[SortKey, ...]:
    for key in order:
        f = _field(fields, key.field)
        if not f.sortable:
            raise QueryError(f"field {f.name!r} has many values: it cannot be a sort key")
    return total_order(order)


def prepare(request: SearchRequest, fields: Fields) -> tuple[Node, tuple[SortKey, ...]]:
    """The checked, canonical filter (keyset included) and total order of ``request``
    over a resource's ``fields``."""
    order = prepare_order(request.order, fields)
    if request.limit < 1:
        raise QueryError(f"limit must be at least 1, got {request.limit}")
    if request.after is not None and len(request.after) != len(order):
        raise QueryError(
            f"the keyset has {len(request.after)} values for {len(order)} sort keys "
            f"({', '.join(k.field for k in order)})"
        )
    node = request.filter
    if request.after is not None:
        # The keyset, with its range bound on the first key where the registry allows
        # one (see ``after``): the same rows as ``SearchRequest.effective_filter``.
        never_null = {f.name for f in fields.values() if f.never_null}
        node = conjunction(node, after(order, request.after, never_null))
    return prepare_filter(node, fields), order


def keyset(order: tuple[SortKey, ...], document: Mapping[str, object]) -> tuple[Scalar, ...]:
    """The sort values of a result ``document`` in ``order``: the ``after`` of the next page."""
    values: list[Scalar] = []
    for key in order:
        value = document.get(key.field)
        if not (value is None or isinstance(value, str | int | float | bool | datetime)):
            raise QueryError(f"field {key.field!r} holds no sortable value")
        values.append(value)
    return tuple(values)
