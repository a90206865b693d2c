"""The bounds a versioned object's fields are held to, by their types: integers within
signed 64 bits, finite floats, strings and collections within ``limits``; checked as
a payload is decoded (``VersionedObject``) and written into its exported JSON Schema."""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaValue

from cellsight.notifications import limits

BoundCheck = Callable[[str, Any], "str | None"]


def _check_int(name: str, value: Any) -> str | None:
    if isinstance(value, int) and not limits.LONG_MIN <= value <= limits.LONG_MAX:
        # Not str(value): a 5000-digit int cannot even be printed (int max_str_digits).
        return f"an integer of {value.bit_length()} bits is outside the signed 64-bit range"
    return None


def _check_float(name: str, value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None


def _check_str(name: str, value: Any) -> str | None:
    cap = limits.string_cap(name)
    if isinstance(value, str) and len(value) > cap:
        return f"{len(value)} characters, the limit is {cap}"
    return None


def _item_parts(value: Any) -> Iterator[Any]:
    """A list's items, a dict's keys and values."""
    for item in value.items() if isinstance(value, dict) else value:
        yield from item if isinstance(item, tuple) else (item,)


def _check_items(name: str, value: Any) -> str | None:
    if len(value) > limits.MAX_ITEMS:
        return f"{len(value)} items, the limit is {limits.MAX_ITEMS}"
    for part in _item_parts(value):
        if isinstance(part, str) and len(part) > limits.NAME_LENGTH:
            return f"an item of {len(part)} characters, the limit is {limits.NAME_LENGTH}"
        if isinstance(part, int) and (problem := _check_int(name, part)):
            return problem
    return None


def bound_kind(annotation: Any) -> str | None:
    """Which bound a field's type gets: ``int``, ``float``, ``str``, ``items`` or none."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (list, dict):
        return "items"
    if annotation is bool:
        return None
    for kind in (int, float, str):
        if annotation is kind:
            return kind.__name__
    return None


_CHECKS: dict[str, BoundCheck] = {
    "int": _check_int,
    "float": _check_float,
    "str": _check_str,
    "items": _check_items,
}


def _check_item_numbers(name: str, value: Any) -> str | None:
    for part in _item_parts(value):
        if isinstance(part, int) and (problem := _check_int(name, part)):
            return problem
    return None


# As stored: the numbers' bounds only (see ``VersionedObject._bounds``).
_STORED_CHECKS: dict[str, BoundCheck] = {
    "int": _check_int,
    "float": _check_float,
    "items": _check_item_numbers,
}


@functools.cache
def bound_checks(cls: type[BaseModel], stored: bool = False) -> tuple[tuple[str, BoundCheck], ...]:
    checks = _STORED_CHECKS if stored else _CHECKS
    out = []
    for name, info in cls.model_fields.items():
        kind = bound_kind(info.annotation)
        if kind is not None and kind in checks:
            out.append((name, checks[kind]))
    return tuple(out)


def schema_with_bounds(cls: type[BaseModel], schema: JsonSchemaValue) -> JsonSchemaValue:
    """The same bounds in the exported JSON Schema."""
    props = schema.get("properties", {})
    for name, info in cls.model_fields.items():
        kind = bound_kind(info.annotation)
        prop = props.get(name)
        if kind is None or prop is None:
            continue
        for branch in prop.get("anyOf", [prop]):
            # A form's own schema (forms.py) may bound it tighter already.
            if kind == "str" and branch.get("type") == "string":
                cap = limits.string_cap(name)
                branch["maxLength"] = min(branch.get("maxLength", cap), cap)
            elif kind == "int" and branch.get("type") == "integer":
                branch.setdefault("minimum", limits.LONG_MIN)
                branch["maximum"] = limits.LONG_MAX
            elif kind == "items" and branch.get("type") in ("array", "object"):
                key = "maxItems" if branch["type"] == "array" else "maxProperties"
                branch[key] = min(branch.get(key, limits.MAX_ITEMS), limits.MAX_ITEMS)
                # An item's, a key's and a value's cap (``_check_items``), as text.
                if branch["type"] == "object":
                    branch["propertyNames"] = _capped(branch.get("propertyNames", {}))
                for part in ("items", "additionalProperties"):
                    if isinstance(branch.get(part), dict) and branch[part].get("type") == "string":
                        branch[part] = _capped(branch[part])
    return schema


def _capped(schema: JsonSchemaValue) -> JsonSchemaValue:
    cap = min(schema.get("maxLength", limits.NAME_LENGTH), limits.NAME_LENGTH)
    return {**schema, "maxLength": cap}
