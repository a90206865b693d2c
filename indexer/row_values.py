"""Raw driver values → document values, planned from the payload models' field types.

Each payload field gets a ``Plan``: a converter that returns the document value or
raises ``NeedsReference``, and, where a value of the right type passes unchanged, the
set of those types, so that whole groups of fields are checked at C speed
(``frozenset.issuperset(map(type, values))``) instead of one call per field. A field
type the planner does not know (a constraint such as ``ge=0``, a union) always raises
``NeedsReference``: the fast path never guesses.
"""

from __future__ import annotations

import json
import json.scanner
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

from cellsight.notifications.base import DATA, UUID_PATTERN, Timestamp, UuidStr, VersionedObject
from cellsight.notifications.forms import IpStr, MacStr, TagList

Convert = Callable[[Any], Any]
_NONE = type(None)
_UUID = re.compile(UUID_PATTERN)
# The C scanner behind json.loads, without its two Python wrappers and whitespace regex.
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


class NeedsReference(Exception):
    """This row has a value the fast path does not handle; use the reference."""


@dataclass(frozen=True)
class Plan:
    convert: Convert
    same: frozenset[type] | None = None  # types that pass unchanged; None: always convert


def fail(value: Any) -> Any:
    raise NeedsReference


def _check(allowed: frozenset[type]) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) in allowed:
            return value
        raise NeedsReference

    return convert


def _float(value: Any) -> Any:
    if value is None or type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise NeedsReference


def to_bool(value: Any) -> Any:
    # SQLite and MariaDB hand booleans over as 0/1.
    if value is True or value is False or value is None:
        return value
    if type(value) is int and value in (0, 1):
        return value == 1
    raise NeedsReference


def _uuid(value: Any) -> Any:
    if type(value) is str and _UUID.fullmatch(value):
        return value
    raise NeedsReference


def _date(value: Any) -> Any:
    """``format_timestamp`` of the stored UTC time, without building a datetime."""
    if value is None:
        return None
    if type(value) is str:
        # SQLite: SQLAlchemy's fixed-width text, YYYY-MM-DD HH:MM:SS.ffffff
        if len(value) == 26 and value[10] == " " and value[19] == "." and value[0] != "0":
            frac = value[20:]
            tail = "Z" if frac == "000000" else f".{frac}Z"
            return f"{value[:10]}T{value[11:19]}{tail}"
        raise NeedsReference
    if type(value) is datetime and value.tzinfo is None and value.year >= 1000:
        # PostgreSQL and MariaDB: naive UTC; isoformat drops a zero fraction as the
        # wire form does.
        return value.isoformat() + "Z"
    raise NeedsReference


def from_json(value: Any) -> Any:
    """A JSON column: text on SQLite and MariaDB, decoded already by psycopg."""
    if type(value) is not str:
        return value
    try:
        obj, end = _scan(value, 0)
    except (StopIteration, ValueError):
        raise NeedsReference from None
    if end != len(value):
        raise NeedsReference  # surrounding whitespace or trailing data: let json decide
    return obj


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not _NONE]
        return (args[0] if len(args) == 1 else None), True
    return annotation, False


def _scalar(inner: Any, optional: bool) -> Plan:
    if inner in (IpStr, MacStr):
        # A row is indexed as its cell holds it, past the contract's rules for addresses
        # (``forms.AS_STORED``): their text passes as any text does.
        inner = str
    nullable = {_NONE} if optional else set()
    for kind in (str, int, bool):
        if inner is kind:
            same = frozenset({kind, *nullable})
            return Plan(_check(same), same)
    convert: Convert = fail
    if inner == UuidStr:
        convert = _uuid
    elif inner == Timestamp:
        convert = _date
    elif inner is float:
        convert = _float
    if optional or convert is fail:
        return Plan(convert)
    return Plan(_not_none(convert))


def _not_none(convert: Convert) -> Convert:
    def required(value: Any) -> Any:
        if value is None:
            raise NeedsReference
        return convert(value)

    return required


_STRS = frozenset({str})


def _str_dict(value: Any) -> Any:
    if (
        type(value) is dict
        and _STRS.issuperset(map(type, value))
        and _STRS.issuperset(map(type, value.values()))
    ):
        return value
    raise NeedsReference


def _str_list(value: Any) -> Any:
    if type(value) is list and _STRS.issuperset(map(type, value)):
        return value
    raise NeedsReference


def plan(annotation: Any, metadata: Sequence[Any] = ()) -> Plan:
    """The plan of one payload field (nested objects included), from its type."""
    if metadata:
        # pydantic moves an Annotated type's extras here: UuidStr, Timestamp and TagList
        # are known; any other (a constraint such as ge=0) the fast path would not enforce.
        annotation = typing.Annotated[(annotation, *metadata)]
        if annotation not in (UuidStr, Timestamp, TagList):
            return Plan(fail)
    inner, optional = _strip_optional(annotation)
    origin = typing.get_origin(inner)
    convert: Convert
    if inner == TagList:
        convert = _str_list  # as the cell holds them, past the contract (``AS_STORED``)
    elif origin is dict and typing.get_args(inner) == (str, str):
        convert = _str_dict
    elif origin is list and typing.get_args(inner) == (str,):
        convert = _str_list
    elif origin is list and _is_model(typing.get_args(inner)[0]):
        convert = _object_list(typing.get_args(inner)[0])
    elif _is_model(inner):
        convert = object_converter(inner)
    else:
        return _scalar(inner, optional)
    return Plan(_nullable(convert) if optional else _not_none(convert))


def _nullable(convert: Convert) -> Convert:
    def nested(value: Any) -> Any:
        return None if value is None else convert(value)

    return nested


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, VersionedObject)


def getter(names: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """``itemgetter`` that always returns a tuple (a single name would not)."""
    if len(names) == 1:
        name = names[0]
        return lambda obj: (obj[name],)
    return itemgetter(*names)


def groups(plans: dict[str, Plan]) -> list[tuple[frozenset[type], Callable[[Any], Any]]]:
    """The pass-through fields of ``plans`` grouped by their allowed types."""
    by_types: dict[frozenset[type], list[str]] = {}
    for name, p in plans.items():
        if p.same is not None:
            by_types.setdefault(p.same, []).append(name)
    return [(same, getter(names)) for same, names in by_types.items()]


def object_converter(model: type[VersionedObject]) -> Convert:
    """A nested object's plain dict → its ``model_dump`` data (defaults in, extras out)."""
    plans = {
        name: plan(info.annotation, info.metadata) for name, info in model.model_fields.items()
    }
    defaults = {
        n: info.get_default(call_default_factory=True) for n, info in model.model_fields.items()
    }
    names = frozenset(plans)
    same_groups = groups(plans)
    others = [(name, p.convert) for name, p in plans.items() if p.same is None]

    def slow(value: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, p in plans.items():
            # An absent key takes the default (a copy: defaults must not be shared).
            out[name] = p.convert(value[name]) if name in value else _copy(defaults[name])
        return out  # unknown keys are dropped, as the models ignore extra fields

    def convert(value: Any) -> dict[str, Any]:
        # A wire-wrapped object, or a non-dict: the reference knows what to do.
        if type(value) is not dict or DATA in value:
            raise NeedsReference
        if value.keys() != names:
            return slow(value)
        for same, get in same_groups:
            if not same.issuperset(map(type, get(value))):
                return slow(value)
        for name, conv in others:  # the dict is ours (freshly decoded): reuse it
            value[name] = conv(value[name])
        return value

    return convert


def _object_list(model: type[VersionedObject]) -> Convert:
    one = object_converter(model)

    def convert(value: Any) -> list[dict[str, Any]]:
        if type(value) is not list:
            raise NeedsReference
        return [one(item) for item in value]

    return convert


def _copy(value: Any) -> Any:
    return type(value)(value) if isinstance(value, dict | list) else value


def copy_default(value: Any) -> Any:
    return _copy(value)
