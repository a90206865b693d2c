"""Which payload class reads a wire object.

Known classes are found by (namespace, name). Anything else is read by shape: a payload
that carries the ``InstancePayload`` fields is an instance snapshot whatever its class
name (Nova emits ~100 such classes); the rest is kept verbatim as a ``GenericPayload``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cellsight.notifications.base import (
    DATA,
    NAME,
    NAMESPACE,
    VERSION,
    WIRE_KEYS,
    VersionedObject,
    wire_ordered,
)
from cellsight.notifications.errors import (
    MalformedNotification,
    MissingField,
    NotificationError,
    OutOfRange,
    brief,
    time_problem,
)
from cellsight.notifications.limits import ENVELOPE_LENGTH
from cellsight.notifications.objects import CELLSIGHT_OBJECTS, ComputeNodePayload
from cellsight.notifications.payloads import NOVA_PAYLOADS, GenericPayload, InstancePayload

# pydantic error types that mean "a bound of cellsight.notifications.limits", not "a wrong type".
_RANGE_ERRORS = frozenset(
    {"out_of_range", "string_too_long", "too_long", "finite_number", "int_parsing_size"}
)

REGISTRY: dict[tuple[str, str], type[VersionedObject]] = {
    (cls.OBJ_NAMESPACE, cls.OBJ_NAME): cls for cls in (*NOVA_PAYLOADS, *CELLSIGHT_OBJECTS)
}
NAMESPACES = frozenset(namespace for namespace, _ in REGISTRY)


def in_wire_order(name: str, data: dict[str, Any], namespace: str = "nova") -> dict[str, Any]:
    """``data`` in the order Nova sends an object called ``name`` (``wire_ordered``)."""
    return wire_ordered(data, REGISTRY.get((namespace, name), InstancePayload).wire_order())


def payload_class(obj: dict[str, Any]) -> type[VersionedObject]:
    """The class that reads this wire object."""
    namespace = obj.get(NAMESPACE, "")
    known = REGISTRY.get((namespace, obj.get(NAME, "")))
    if known is not None:
        return known
    if namespace not in NAMESPACES:
        # oslo.versionedobjects refuses another project's object (UnsupportedObjectError);
        # read by shape it would be indexed as one of Nova's instances.
        raise MalformedNotification(
            f"payload: {brief(obj.get(NAME), 60)} is of namespace {brief(namespace, 60)}, "
            f"neither Nova's ({InstancePayload.OBJ_NAMESPACE}) nor Cellsight's "
            f"({ComputeNodePayload.OBJ_NAMESPACE})"
        )
    data = obj.get(DATA)
    nova = namespace == InstancePayload.OBJ_NAMESPACE
    if nova and isinstance(data, dict) and InstancePayload.has_shape(data):
        return InstancePayload
    return GenericPayload


def describe_location(loc: tuple[int | str, ...]) -> str:
    # Drop pydantic's internal steps (function-wrap names) and keep field names.
    parts = [str(p) for p in loc if not (isinstance(p, str) and "[" in p)]
    return ".".join(parts) or "(object)"


def decode_payload(obj: Any, where: str = "payload") -> VersionedObject:
    """Decode one versioned object, raising a named error that says what and where."""
    if not isinstance(obj, dict) or not obj.keys() >= WIRE_KEYS:
        raise MalformedNotification(
            f"{where}: not a versioned object (needs {', '.join(sorted(WIRE_KEYS))})"
        )
    for key in (NAME, NAMESPACE, VERSION):
        if not isinstance(obj[key], str):
            got = brief(obj[key], 60)
            raise MalformedNotification(f"{where}: {key} must be a string, got {got}")
        if len(obj[key]) > ENVELOPE_LENGTH:
            raise OutOfRange(
                f"{where}: {key} of {len(obj[key])} characters is longer than {ENVELOPE_LENGTH}"
            )
    cls = payload_class(obj)
    label = f"{obj[NAME]} {obj[VERSION]}"
    try:
        return cls.model_validate(obj)
    except NotificationError:
        raise
    except ValidationError as exc:
        err = exc.errors()[0]
        field = describe_location(err["loc"])
        if err["type"] == "missing" or (field == "uuid" and err.get("input") is None):
            raise MissingField(f"{where}: {label}: field {field} is required", field) from None
        error = OutOfRange if err["type"] in _RANGE_ERRORS else MalformedNotification
        says = time_problem(err.get("input"), err["msg"]) if "date" in err["type"] else err["msg"]
        raise error(
            f"{where}: {label}: field {field}: {says} (got {brief(err.get('input'))})"
        ) from None
