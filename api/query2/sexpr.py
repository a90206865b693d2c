"""Ganeti-style S-expression filters → the filter tree (``cellsight.query.tree``).

A filter is a JSON list whose head is an operator::

    ["&", f1, f2, ...]   ["|", f1, ...]   ["!", f]
    ["?", field]                      true value: a true bool, a non-empty string or
                                      list, a non-zero number, any timestamp (Ganeti)
    ["==", field, value]  ("=" too)   ["!=", field, value]   (the negation of ==)
    ["<" | "<=" | ">" | ">=", field, value]
    ["=~", field, regex]              unanchored, the portable subset of ``regex.py``
    ["=[]", listfield, value]         exact membership

``!=`` is ``["!", ["==", ...]]``, as in Ganeti where a missing value differs from
everything; every other comparison follows the tree's rules (a missing value matches
nothing, a list matches when any element does). Values must fit the field's kind:
strings for text, ``true``/``false`` for bools (``==``/``!=`` only), integers for
integer fields, timestamps as seconds since the epoch or ISO 8601. The computed
``status`` takes ``==``/``!=`` with Nova's status names. Limits: nesting depth
``MAX_DEPTH`` (10) and ``MAX_TERMS`` operators in all. Every error is a ``FilterError``
whose message names the offending field or operator; the API turns it into a 400.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from cellsight.api.query2.fields import COMPUTED, REGISTRY, FieldDef, QKind
from cellsight.api.status import status_filter
from cellsight.indexer.fields import Kind, field_map
from cellsight.notifications.errors import clip
from cellsight.query.fields import DocField
from cellsight.query.prepare import QueryError, encodable, prepare_filter
from cellsight.query.regex import InvalidRegex, validate
from cellsight.query.tree import (
    Compare,
    Contains,
    Exists,
    MatchAll,
    Node,
    Not,
    Op,
    Regex,
    Scalar,
    conjunction,
    disjunction,
)

MAX_DEPTH = 10
MAX_TERMS = 1000
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

_COMPARE = {
    "==": Op.EQ,
    "=": Op.EQ,
    "<": Op.LT,
    "<=": Op.LE,
    ">": Op.GT,
    ">=": Op.GE,
}
OPERATORS = ("&", "|", "!", "?", "==", "=", "!=", "<", "<=", ">", ">=", "=~", "=[]")


class FilterError(ValueError):
    """An invalid filter. The message is what the client reads in the 400."""

    code = "invalid_filter"


class MalformedFilter(FilterError):
    code = "malformed_filter"


class UnknownFilterField(FilterError):
    code = "unknown_field"

    def __init__(self, resource: str, field: str) -> None:
        self.field = field
        super().__init__(f"filter: unknown {resource} field {_show(field)}")


class FieldNotFilterable(FilterError):
    code = "field_not_filterable"

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"filter: field {field!r} holds nested objects and cannot be filtered")


class WrongValueKind(FilterError):
    code = "wrong_value_kind"

    def __init__(self, field: str, op: str, value: Any, wanted: str) -> None:
        self.field = field
        super().__init__(f"filter: {op} on field {field!r} takes {wanted}, not {_show(value)}")


class FilterTooDeep(FilterError):
    code = "filter_too_deep"


class FilterTooLarge(FilterError):
    code = "filter_too_large"


class BadFilterRegex(FilterError):
    code = "invalid_regex"

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        super().__init__(f"filter: bad regex for field {field!r}: {reason}")


def _show(value: Any, limit: int = 60) -> str:
    """A value for an error message, cut short: the client's input is echoed back."""
    return clip(repr(value), limit)


@dataclass(frozen=True)
class ParsedFilter:
    tree: Node
    fields: frozenset[str]  # the registry names the filter refers to


@cache
def filter_fields(resource: str) -> dict[str, DocField]:
    """The document fields a filter may name: the stored ones, and the node fields each
    snapshot adds (``fields.COMPUTED["node"]``, evaluated in memory like stored ones)."""
    # The instance's computed ``status`` is not among them: the parser turns it into
    # state pairs before this check.
    derived = COMPUTED["node"] if resource == "node" else []
    return {
        **field_map(resource),
        **{f.doc_field: DocField(f.doc_field, f.doc_kind, f.many, f.doc) for f in derived},
    }


def parse(resource: str, raw: Any, *, max_depth: int = MAX_DEPTH) -> ParsedFilter:
    """The tree of a filter and the fields it names; ``None`` matches everything."""
    if raw is None:
        return ParsedFilter(MatchAll(), frozenset())
    parser = _Parser(resource, max_depth)
    tree = parser.parse(raw, 1)
    try:
        # The compilers' own check: whatever passes here compiles on every path.
        prepare_filter(tree, filter_fields(resource))
    except QueryError as exc:
        raise MalformedFilter(f"filter: {exc}") from None
    return ParsedFilter(tree, frozenset(parser.named))


def parse_filter(resource: str, raw: Any, *, max_depth: int = MAX_DEPTH) -> Node:
    return parse(resource, raw, max_depth=max_depth).tree


class _Parser:
    def __init__(self, resource: str, max_depth: int) -> None:
        self.resource = resource
        self.fields = REGISTRY[resource]
        self.max_depth = max_depth
        self.named: set[str] = set()
        self.terms = 0

    def parse(self, raw: Any, depth: int) -> Node:
        if depth > self.max_depth:
            raise FilterTooDeep(f"filter: nested deeper than {self.max_depth} levels")
        self.terms += 1
        if self.terms > MAX_TERMS:
            # Width, like depth, bounds the query every cell and the index must run.
            raise FilterTooLarge(f"filter: more than {MAX_TERMS} operators")
        if not isinstance(raw, list) or not raw:
            raise MalformedFilter(
                f"filter: expected a non-empty list [operator, ...], got {_show(raw)}"
            )
        op, args = raw[0], raw[1:]
        if not isinstance(op, str) or op not in OPERATORS:
            raise MalformedFilter(
                f"filter: unknown operator {_show(op)} (use one of {' '.join(OPERATORS)})"
            )
        if op in ("&", "|"):
            children = [self.parse(arg, depth + 1) for arg in args]
            return conjunction(*children) if op == "&" else disjunction(*children)
        if op == "!":
            _arity(op, args, 1)
            return Not(self.parse(args[0], depth + 1))
        if op == "?":
            _arity(op, args, 1)
            field = self.field(op, args[0])
            # Every instance shows some status, if only UNKNOWN.
            return MatchAll() if field.computed else _truth(field)
        _arity(op, args, 2)
        field, value = self.field(op, args[0]), args[1]
        if field.computed:
            return self.status(op, field, value)
        if op == "=~":
            return self.regex(field, value)
        if op == "=[]":
            if not field.many:
                raise MalformedFilter(f"filter: =[] needs a list field; {field.name!r} is not one")
            return Contains(field.doc_field, _value(field, op, value))
        if op == "!=":
            return Not(Compare(field.doc_field, Op.EQ, _value(field, op, value)))
        if field.kind is QKind.BOOL and _COMPARE[op] is not Op.EQ:
            raise MalformedFilter(f"filter: {op} does not apply to bool field {field.name!r}")
        return Compare(field.doc_field, _COMPARE[op], _value(field, op, value))

    def field(self, op: str, name: Any) -> FieldDef:
        if not isinstance(name, str):
            raise MalformedFilter(f"filter: {op} expects a field name, got {_show(name)}")
        field = self.fields.get(name)
        if field is None:
            raise UnknownFilterField(self.resource, name)
        if not field.filterable:
            raise FieldNotFilterable(name)
        self.named.add(name)
        return field

    def status(self, op: str, field: FieldDef, value: Any) -> Node:
        """Nova's status names (case-insensitive) as the state pairs that show them."""
        if op not in ("==", "=", "!="):
            raise MalformedFilter(f"filter: {op} does not apply to {field.name!r}; use == or !=")
        if not isinstance(value, str):
            raise WrongValueKind(field.name, op, value, "a string")
        _storable(field, op, value)  # as every other text value: no status holds either
        matches = status_filter([value])
        return Not(matches) if op == "!=" else matches

    def regex(self, field: FieldDef, pattern: Any) -> Node:
        if field.doc_kind not in (Kind.KEYWORD, Kind.TEXT, Kind.IP):
            raise MalformedFilter(f"filter: =~ needs a text field; {field.name!r} is not one")
        if not isinstance(pattern, str):
            raise WrongValueKind(field.name, "=~", pattern, "a regex string")
        _storable(field, "=~", pattern)  # the pattern goes to the engine or database too
        try:
            validate(pattern)
        except InvalidRegex as exc:
            raise BadFilterRegex(field.name, str(exc)) from None
        return Regex(field.doc_field, pattern)


def _arity(op: str, args: list[Any], count: int) -> None:
    if len(args) != count:
        noun = "operand" if count == 1 else "operands"
        raise MalformedFilter(f"filter: {op} takes {count} {noun}, got {len(args)}")


def _truth(field: FieldDef) -> Node:
    """Ganeti's ``?``: the field's value is true in Python's sense."""
    if field.kind is QKind.BOOL:
        return Compare(field.doc_field, Op.EQ, True)
    # A missing value matches no comparison, so != excludes it as Python's bool(None) does.
    if field.kind in (QKind.NUMBER, QKind.UNIT):
        return Compare(field.doc_field, Op.NE, 0 if field.integral else 0.0)
    if field.kind is QKind.TEXT:
        return Compare(field.doc_field, Op.NE, "")
    return Exists(field.doc_field)  # lists (empty is missing) and timestamps


def _value(field: FieldDef, op: str, value: Any) -> Scalar:
    """``value`` checked against the field's kind and converted to the tree's type."""
    kind = field.doc_kind
    if kind in (Kind.KEYWORD, Kind.TEXT, Kind.IP):
        if isinstance(value, str):
            return _storable(field, op, value)
        raise WrongValueKind(field.name, op, value, "a string")
    if kind is Kind.BOOLEAN:
        if isinstance(value, bool):
            return value
        raise WrongValueKind(field.name, op, value, "true or false")
    if kind is Kind.DATE:
        return _timestamp(field, op, value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise WrongValueKind(field.name, op, value, "a number")
    # isfinite() of an int past a double's range raises: ints are checked by range below.
    if isinstance(value, float) and not math.isfinite(value):
        raise WrongValueKind(field.name, op, value, "a number")
    if kind is Kind.LONG:
        if not LONG_MIN <= value <= LONG_MAX:
            # Named as sent: 1e308, not the int it would have become.
            raise WrongValueKind(field.name, op, value, "a 64-bit integer")
        if isinstance(value, float):
            if not value.is_integer():
                raise WrongValueKind(field.name, op, value, "an integer")
            return int(value)
        return value
    try:
        return float(value)
    except OverflowError:
        raise WrongValueKind(field.name, op, value, "a number within a double's range") from None


def _storable(field: FieldDef, op: str, value: str) -> str:
    # JSON can carry both, and no database or engine can hold either.
    if "\x00" in value:
        raise WrongValueKind(field.name, op, value, "a string without NUL characters")
    if not encodable(value):
        raise WrongValueKind(field.name, op, value, "valid Unicode (no lone surrogates)")
    return value


def _timestamp(field: FieldDef, op: str, value: Any) -> datetime:
    """Seconds since the epoch (Ganeti's form) or an ISO 8601 string; naive means UTC."""
    wanted = "seconds since the epoch or an ISO 8601 time"
    try:
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value)
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        pass
    raise WrongValueKind(field.name, op, value, wanted)
