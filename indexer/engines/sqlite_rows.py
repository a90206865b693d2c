"""Document → row for the embedded index, checked against the strict mapping.

Bulk sync pushes every instance through here, so the common case runs on C-level
builtins: the row is ``map(doc.get, columns)``, and since columns are grouped by kind,
each kind's values are type-checked as one slice. Anything unusual (a wrong type, a
coercion Elasticsearch would make, an unknown field) takes the per-field path, which
is the authority: it either builds the row or names the field in ``InvalidDocument``.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from functools import partial
from math import isfinite
from operator import is_not, itemgetter
from typing import Any

import msgspec
import orjson

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.sqlite_schema import LONG_MAX, LONG_MIN, Schema, date_to_micros
from cellsight.indexer.fields import DocField, Kind, values_of
from cellsight.notifications.errors import brief

_NONE = type(None)
_STR: frozenset[type] = frozenset({str, _NONE})
_INT: frozenset[type] = frozenset({int, _NONE})
_BOOL: frozenset[type] = frozenset({bool, _NONE})
_NUMBER: frozenset[type] = frozenset({float, int, _NONE})
_OBJECT: frozenset[type] = frozenset({dict, list, _NONE})
_LIST: frozenset[type] = frozenset({list, _NONE})
_STRINGS: frozenset[type] = frozenset({str})
_STR_KINDS = (Kind.KEYWORD, Kind.TEXT, Kind.IP)
_is_value = partial(is_not, None)


class InvalidDocument(ValueError):
    """The document does not fit the strict mapping; the message names the field."""


class Prepared(msgspec.Struct, gc=False):
    """A document's row, JSON and multi-valued rows. A Struct: built once per document
    written, and its ``__init__`` takes a quarter of a NamedTuple's (``gc=False``: it
    holds no cycle, and the collector need not walk a batch's thousand of them)."""

    op: WriteOp
    row: tuple[Any, ...]  # id, version, columns: everything but rid
    doc: str
    side: list[tuple[str, str]]  # (field, value) of the multi-valued fields

    def bindable(self) -> bool:
        """Whether sqlite3 can bind it: a lone surrogate in a string cannot be encoded."""
        try:
            for value in (*self.row, *(v for pair in self.side for v in pair)):
                if type(value) is str:
                    value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True


_ENCODER = msgspec.json.Encoder()
# orjson writes the plain JSON types itself; subclasses of str, int, dict and list,
# dataclasses and datetimes it passes on (``TypeError``) for msgspec, which refused or
# wrote them differently (a str subclass, a dataclass's ``_private`` field, an offset
# with seconds).
_PLAIN_ONLY = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)


def encode_json(value: Any) -> str:
    """orjson, and msgspec for what orjson refuses. JSON is the largest cost of a bulk
    load: on the indexer's documents orjson took 3.3-3.6 µs a document where msgspec
    took 4.5-4.7 (20,000 of them; 1.3 against 4.1 on a batch of 1,000 in the cache),
    and msgspec's is 3-4x the stdlib's. orjson refuses, with ``TypeError``, what msgspec
    encodes or refuses as before (an integer past 64 bits, a key that is no string, a
    set, bytes, nesting past 254, a lone surrogate, and what ``_PLAIN_ONLY`` passes on),
    so those go to msgspec; what orjson writes has the value msgspec wrote, in the same
    bytes but for a float's exponent (``1e+16``)."""
    try:
        return orjson.dumps(value, option=_PLAIN_ONLY).decode()
    except TypeError:
        return _ENCODER.encode(value).decode()


# Stored documents are JSON this module wrote. msgspec reads them with the same result as
# ``json.loads`` (integers of any size included) in half the instructions or less.
decode_json: Callable[[str], Any] = msgspec.json.Decoder().decode


def _bad(f: DocField, value: Any) -> InvalidDocument:
    return InvalidDocument(
        f"field [{f.name}] of type [{f.kind.value}{'[]' if f.many else ''}] cannot take "
        f"{type(value).__name__} {brief(value, 60)}"
    )


def check_value(f: DocField, value: Any) -> Any:
    """The column (or side) value of one non-null field value, as Elasticsearch would
    take it: an integral number for a long and a lone value for a list are accepted."""
    kind, t = f.kind, type(value)
    if kind is Kind.OBJECT:
        if t is list or (t is dict and not f.many):
            return value
    elif f.many:
        items = [value] if t is str else value if t is list else None
        if items is not None:
            for item in items:
                if type(item) is not str:
                    raise _bad(f, item)
            return items
    elif kind is Kind.IP:
        if t is str:
            try:
                ipaddress.ip_address(value)
                return value
            except ValueError:
                pass
    elif kind in _STR_KINDS:
        if t is str:
            return value
    elif kind is Kind.LONG:
        if t is float and value.is_integer():
            value, t = int(value), int
        if t is int:
            if LONG_MIN <= value <= LONG_MAX:
                return value
            raise InvalidDocument(
                f"field [{f.name}] of type [long]: {brief(value, 60)} is out of range"
            )
    elif kind is Kind.DOUBLE:
        if t is float or t is int:
            if _finite(value):
                return value
            what = "is out of a double's range" if t is int else "is not finite"
            raise InvalidDocument(f"field [{f.name}] of type [double]: {brief(value, 60)} {what}")
    elif kind is Kind.BOOLEAN:
        if t is bool:
            return value
    elif kind is Kind.DATE and t is str:
        try:
            return date_to_micros(value)
        except ValueError:
            pass
    raise _bad(f, value)


def _finite(value: float | int) -> bool:
    """A double's value: an integer past a double's range (~1.8e308) is not finite."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class RowBuilder:
    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._known = frozenset(schema.fields)
        self._names = tuple(schema.row_names[2:])
        self._positions = {name: i for i, name in enumerate(schema.row_names)}
        self._longs = schema.row_slice(Kind.LONG)
        self._doubles = schema.row_slice(Kind.DOUBLE)
        self._dates = schema.row_slice(Kind.DATE)
        assert self._dates.stop in (len(schema.row_names), 0), "dates must be the last columns"
        self._many = tuple(f.name for f in schema.many_fields)
        # Fields outside the row whose type the fast path checks: the objects, the
        # multi-valued keywords (their items are checked one by one) and "version".
        self._extra = (
            *(f.name for f in schema.object_fields),
            *self._many,
            "version",
        )
        allowed: list[frozenset[type]] = [frozenset({str}), frozenset({int})]
        by_kind = {
            Kind.KEYWORD: _STR,
            Kind.TEXT: _STR,
            Kind.LONG: _INT,
            Kind.BOOLEAN: _BOOL,
            Kind.DOUBLE: _NUMBER,
            Kind.DATE: _STR,
        }
        allowed.extend(by_kind.get(f.kind, frozenset()) for f in schema.columns)
        allowed.extend(_OBJECT if not f.many else _LIST for f in schema.object_fields)
        allowed.extend(_LIST for _ in self._many)
        allowed.append(_INT)
        self._allowed = tuple(allowed)
        # A document the mapping built holds every field, so one C call takes the row's
        # values (a KeyError falls back to ``get``: None for an absent field), and since
        # the row and the extras name every field of the mapping (checked here), such a
        # document with that many keys has no unknown one: a length, not 51 lookups.
        # Measured under callgrind on the benchmark's documents: 120.0k → 100.9k
        # instructions a document for ``prepare``.
        self._take = values_of(itemgetter, self._names)
        self._take_extra = values_of(itemgetter, self._extra)
        if {*self._names, *self._extra} == self._known:
            self._field_count = len(self._known)
        else:
            self._field_count = -1  # never equal: the unknown-field check always runs
        # Type signatures of rows that passed the per-kind check. Documents from the
        # mapping come in a handful of shapes (which fields are null), so checking a
        # signature once and then looking it up replaces ~50 type checks per document.
        self._good: set[tuple[type, ...]] = set()
        # Elasticsearch checks the IP syntax; no field has that kind yet, so no fast path.
        self._fast = not any(f.kind is Kind.IP for f in schema.columns)

    def _signature_ok(self, signature: tuple[type, ...]) -> bool:
        if len(signature) != len(self._allowed):
            return False
        ok = all(t in allowed for t, allowed in zip(signature, self._allowed, strict=True))
        if ok and len(self._good) < 4096:
            self._good.add(signature)
        return ok

    def prepare(self, op: WriteOp) -> Prepared:
        if type(op.id) is not str or not 0 < len(op.id) <= 512:
            raise InvalidDocument(f"id {brief(op.id, 60)} must be a string of 1 to 512 characters")
        if type(op.version) is not int or not 0 <= op.version <= LONG_MAX:
            shown = brief(op.version, 60)
            raise InvalidDocument(f"version {shown} must be an integer in [0, 2^63)")
        doc = op.document
        if not self._fast or type(doc) is not dict:
            return self._checked(op)
        get = doc.get
        try:
            row: list[Any] = [op.id, op.version, *self._take(doc)]
            extra = self._take_extra(doc)
            # It holds every field of the mapping; as many keys as those: no other.
            known = len(doc) == self._field_count
        except KeyError:
            row = [op.id, op.version, *map(get, self._names)]
            extra = tuple(map(get, self._extra))
            known = False
        if not known and not self._known.issuperset(doc):
            return self._checked(op)
        signature = (*map(type, row), *map(type, extra))
        if signature not in self._good and not self._signature_ok(signature):
            return self._checked(op)
        # Every long within a long's range: the one at -2^63 takes the checked path.
        if max(map(abs, filter(None, row[self._longs])), default=0) > LONG_MAX or not (
            LONG_MIN <= (extra[-1] or 0) <= LONG_MAX
        ):
            return self._checked(op)
        try:
            if not all(map(isfinite, filter(_is_value, row[self._doubles]))):
                return self._checked(op)
            # In place, one slice: the dates are the row's last columns.
            row[self._dates] = [None if v is None else date_to_micros(v) for v in row[self._dates]]
        except (TypeError, ValueError, OverflowError):
            return self._checked(op)
        side: list[tuple[str, str]] = []
        for name in self._many:
            values = get(name)
            if values:
                if not _STRINGS.issuperset(map(type, values)):
                    return self._checked(op)
                side.extend([(name, v) for v in values])
        return Prepared(op, tuple(row), _encode(doc), side)

    def _checked(self, op: WriteOp) -> Prepared:
        """Field by field: the row, or ``InvalidDocument`` naming the first bad field."""
        row: list[Any] = [None] * len(self._positions)
        row[0], row[1] = op.id, op.version
        side: list[tuple[str, str]] = []
        fields = self.schema.fields
        for name, value in op.document.items():
            f = fields.get(name)
            if f is None:
                raise InvalidDocument(
                    f"unknown field [{name}]: the {self.schema.resource} mapping is strict"
                )
            if value is None:
                continue
            value = check_value(f, value)
            if f.many and f.kind is not Kind.OBJECT:
                side.extend((name, v) for v in value)
            elif name in self._positions and name != "version":
                row[self._positions[name]] = value
        return Prepared(op, tuple(row), _encode(op.document), side)


def _encode(doc: dict[str, Any]) -> str:
    try:
        return encode_json(doc)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidDocument(f"document is not JSON: {exc}") from None
