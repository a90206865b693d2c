"""The compiled decode path: bytes → validated payload, the notification in one msgspec
pass.

The oslo wrapper is parsed by orjson, the reference's parser; the notification inside
it by msgspec, straight into the Structs below (a bare body is parsed by both).

The msgspec Structs here are generated from the pydantic payload models (their fields,
types, defaults and ``ge`` constraints) and from :mod:`cellsight.notifications.limits`, so the
models stay the one source of truth. The ``nova_object`` wrappers are Structs too
(nested names as ``Literal``, versions as a ``Literal`` of the known major's minors),
so no Python runs per nested object; the top-level class is chosen by msgspec's tagged
union on ``nova_object.name``. Nova's other instance payload classes
(``NOVA_INSTANCE_SUBCLASSES``: ``instance.exists``, volume, snapshot, rebuild ...) are read
as the registry reads them, by shape: as an InstancePayload whose data carries most of
its ``SHAPE_FIELDS`` (those fields default to UNSET here, so that presence is counted).

This path is strict where the reference (``cellsight.notifications.envelope.decode``) is lax
(``"5"`` for an int, ``0/1`` for a bool, unix times, non-canonical UUIDs), and it knows
by name only the classes above (any other is read by shape by the reference). It never
decides that a message is bad: whenever it declines (:class:`Declined`, or any parser's
error), the caller runs the reference, which accepts the message or raises the
contract's named error. A message it accepts the reference accepts too, with the same
values (tested differentially), with one known exception: msgspec skips the value of a
field no Struct declares without reading it, so a number there beyond a double's range
(``1e400``) inside an oslo wrapper's message, which the reference's parser refuses
(``malformed``), passes here; the document, which never holds such a field, is the
same. A bare body is parsed whole by orjson first, so it has no such difference.
"""

from __future__ import annotations

import functools
import operator
import re
import types
import typing
from datetime import datetime
from typing import Annotated, Any, Literal

import annotated_types
import msgspec
import orjson
from msgspec import Meta, Struct, field

from cellsight.notifications import limits
from cellsight.notifications.base import (
    DATA,
    LOGGED_VERSIONS,
    NAMESPACE,
    VERSION,
    Timestamp,
    UuidStr,
    VersionedObject,
)
from cellsight.notifications.base import NAME as NAME_KEY
from cellsight.notifications.envelope import OSLO_VERSION, EventType, Priority
from cellsight.notifications.fastcheck import (
    Declined,
    IpText,
    MacText,
    TagsText,
    TimeText,
    UuidText,
    envelope_time,
    finish,
)
from cellsight.notifications.forms import IpStr, MacStr, TagList
from cellsight.notifications.objects import ComputeNodePayload
from cellsight.notifications.payloads import (
    NOVA_INSTANCE_SUBCLASSES,
    InstanceActionPayload,
    InstanceCreatePayload,
    InstancePayload,
    InstanceUpdatePayload,
)

FAST_CLASSES: tuple[type[VersionedObject], ...] = (
    InstancePayload,
    InstanceActionPayload,
    InstanceCreatePayload,
    InstanceUpdatePayload,
    ComputeNodePayload,
)
_seen_newer: set[tuple[str, str]] = set()


def _str(cap: int) -> Any:
    return Annotated[str, Meta(max_length=cap)]


def _field_type(name: str, annotation: Any, metadata: list[Any], wires: dict[Any, Any]) -> Any:
    if annotation == UuidStr:
        return UuidText
    if annotation == Timestamp:
        # Text first: msgspec rounds a fraction beyond microseconds where the reference
        # truncates it, so only the forms both read alike pass (``finish``), then
        # fromisoformat.
        return TimeText
    if annotation == IpStr:
        return IpText  # the address is checked by ``finish``
    if annotation == MacStr:
        return MacText  # so is the MAC
    if annotation == TagList:
        return TagsText  # lengths and count by msgspec, the rest by ``finish``
    if typing.get_origin(annotation) is typing.Annotated:
        raise TypeError(f"{name}: {annotation!r} is not generated")
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"{name}: unions other than X | None are not generated")
        return _field_type(name, args[0], metadata, wires) | None
    if metadata and annotation is not int:
        raise TypeError(f"{name}: constraints on {annotation!r} are not generated")
    if origin is list:
        (item,) = typing.get_args(annotation)
        inner = _field_type(name, item, [], wires)
        if item is str:
            inner = _str(limits.NAME_LENGTH)
        return Annotated[list[inner], Meta(max_length=limits.MAX_ITEMS)]  # type: ignore[valid-type]
    if origin is dict:
        if typing.get_args(annotation) != (str, str):
            raise TypeError(f"{name}: only dict[str, str] is generated")
        key = _str(limits.NAME_LENGTH)
        return Annotated[dict[key, key], Meta(max_length=limits.MAX_ITEMS)]  # type: ignore[valid-type]
    if isinstance(annotation, type) and issubclass(annotation, VersionedObject):
        return wire_struct(annotation, wires)
    if annotation is bool or annotation is float:
        return annotation
    if annotation is str:
        return _str(limits.string_cap(name))
    if annotation is int:
        ge = limits.LONG_MIN
        for m in metadata:
            if not isinstance(m, annotated_types.Ge):
                raise TypeError(f"{name}: constraint {m!r} is not generated")
            ge = max(ge, int(m.ge))  # type: ignore[call-overload]
        return Annotated[int, Meta(ge=ge, le=limits.LONG_MAX)]
    raise TypeError(f"{name}: type {annotation!r} is not generated")


def data_struct(
    model: type[VersionedObject], wires: dict[Any, Any], unset: frozenset[str] = frozenset()
) -> type[Struct]:
    """The Struct of ``model``'s ``nova_object.data``: same fields, types, defaults; the
    fields in ``unset`` default to ``msgspec.UNSET`` instead (absent, not defaulted)."""
    fields: list[tuple[str, Any, Any]] = []
    # In the order Nova sends the keys: msgspec looks each key up from the field after
    # the one it last matched, so a key in its place is found at the first comparison.
    for name in model.wire_order():
        info = model.model_fields[name]
        annotation: Any = info.annotation
        metadata = list(info.metadata)
        if metadata and not all(isinstance(m, annotated_types.Ge) for m in metadata):
            # pydantic moved an Annotated type's extras here (UuidStr, Timestamp).
            annotation, metadata = Annotated[(annotation, *metadata)], []
        kind = _field_type(name, annotation, metadata, wires)
        if name in unset:
            fields.append((name, kind | msgspec.UnsetType, msgspec.UNSET))
        elif info.default_factory is not None:
            fields.append((name, kind, field(default_factory=info.default_factory)))  # type: ignore[arg-type]
        elif info.is_required():
            fields.append((name, kind, msgspec.NODEFAULT))
        else:
            fields.append((name, kind, info.default))
    suffix = "ShapedData" if unset else "Data"
    return msgspec.defstruct(f"{model.__name__}{suffix}", fields, kw_only=True, gc=False)


# Minors of a nested object's known major that the fast path reads; any other version
# declines (the reference decides). A Literal is one dict lookup in C where the pattern
# it replaced called Python's ``re`` for every nested object: 8,500 instructions a
# notification of the benchmark's kind (callgrind), 7% of its typed decode. A version it
# declines (``1.05``, ``1.100``) gets the reference's verdict, also for a message with an
# undeclared number past a double's range (the known difference above), which the
# pattern let through and the reference calls malformed.
NESTED_MINORS = 100


def _version_type(model: type[VersionedObject]) -> Any:
    major = model.OBJ_VERSION.split(".")[0]
    return Literal[tuple(f"{major}.{minor}" for minor in range(NESTED_MINORS))]


def wire_struct(model: type[VersionedObject], wires: dict[Any, Any]) -> Any:
    """A nested object's wrapper: its name and namespace fixed, its version of the known
    major (any other declines: the reference names it)."""
    if model not in wires:
        wires[model] = msgspec.defstruct(
            f"{model.__name__}Wire",
            [
                ("name", Literal[model.OBJ_NAME], field(name=NAME_KEY)),
                ("namespace", Literal[model.OBJ_NAMESPACE], field(name=NAMESPACE)),
                ("version", _version_type(model), field(name=VERSION)),
                ("data", data_struct(model, wires), field(name=DATA)),
            ],
            gc=False,
        )
    return wires[model]


def _top_struct(
    model: type[VersionedObject], wires: dict[Any, Any], name: str = "", data: Any = None
) -> type[Struct]:
    """The payload's wrapper, chosen by its name: ``model``'s own, or ``name`` read with
    the ``data`` Struct given."""
    return msgspec.defstruct(
        f"{name or model.__name__}Top",
        [
            ("namespace", str, field(name=NAMESPACE)),
            (
                "version",
                Annotated[str, Meta(max_length=limits.ENVELOPE_LENGTH)],
                field(name=VERSION),
            ),
            ("data", data or data_struct(model, wires), field(name=DATA)),
        ],
        tag_field=NAME_KEY,
        tag=name or model.OBJ_NAME,
        gc=False,
    )


_WIRES: dict[Any, Any] = {}
_TOPS: dict[type[Struct], type[VersionedObject]] = {
    _top_struct(model, _WIRES): model for model in FAST_CLASSES
}
# By shape: uuid stays required (the reference names a missing one, MissingField).
_SHAPE_OPTIONAL = sorted(InstancePayload.SHAPE_FIELDS - {"uuid"})
_SHAPED_DATA = data_struct(InstancePayload, _WIRES, unset=frozenset(_SHAPE_OPTIONAL))
_SHAPED: dict[type[Struct], str] = {
    _top_struct(InstancePayload, _WIRES, name, _SHAPED_DATA): name
    for name in NOVA_INSTANCE_SUBCLASSES
}
_get_shape_optional = operator.attrgetter(*_SHAPE_OPTIONAL)
_DEFAULTS: dict[str, Any] = {
    name: info.default_factory or (lambda default=info.default: default)
    for name, info in InstancePayload.model_fields.items()
    if name in InstancePayload.SHAPE_FIELDS
}
_Envelope255 = _str(limits.ENVELOPE_LENGTH)
_Payload = typing.Union[tuple([*_TOPS, *_SHAPED])]  # type: ignore[valid-type]  # noqa: UP007


class _Body(Struct, gc=False):
    """A bare notification (every key optional: a missing one declines); an
    ``oslo.message`` key in it is a wrapper inside a wrapper, which declines too."""

    oslo_message: str | None = field(name="oslo.message", default=None)
    event_type: _Envelope255 | None = None  # type: ignore[valid-type]
    publisher_id: _Envelope255 | None = None  # type: ignore[valid-type]
    priority: _Envelope255 | None = None  # type: ignore[valid-type]
    payload: _Payload | None = None  # type: ignore[valid-type]
    timestamp: str | None = None
    message_id: _Envelope255 | None = None  # type: ignore[valid-type]


_decoder = msgspec.json.Decoder(_Body)


class FastNotification(typing.NamedTuple):
    event_type: str
    event: EventType
    priority: Priority
    timestamp: datetime | None
    message_id: str | None
    payload_class: type[VersionedObject]
    obj_name: str
    obj_version: str
    data: Any  # the generated ``<Model>Data`` Struct


def decode_fast(body: bytes | bytearray | memoryview | str) -> FastNotification:
    """Decode or raise (``Declined`` or a parser's error): never a contract verdict."""
    if isinstance(body, memoryview):
        # Measured in bytes, as the reference measures it; orjson, its parser, refuses a
        # view that is not contiguous.
        if body.nbytes > limits.MAX_BODY_BYTES or not body.contiguous:
            raise Declined("too large or not contiguous")
        body = bytes(body)
    elif len(body) > limits.MAX_BODY_BYTES:
        raise Declined("too large")
    # The oslo wrapper is read by the reference's own parser: orjson checks the whole
    # body's UTF-8 (msgspec only what it decodes) and unescapes the inner message's
    # 3 KB a third faster than msgspec. The wrapper's other keys are ignored, as the
    # reference ignores them. A bare body is read by the typed decoder again (rare).
    wrapper = orjson.loads(body)
    if type(wrapper) is not dict:
        raise Declined("not an object")
    if "oslo.message" in wrapper:
        message = wrapper["oslo.message"]
        if wrapper.get("oslo.version") != OSLO_VERSION or type(message) is not str:
            raise Declined("oslo.version")
        outer = _decoder.decode(message)
        if outer.oslo_message is not None:
            raise Declined("nested oslo wrapper")
    elif "oslo.version" in wrapper:
        raise Declined("oslo.version without oslo.message")
    else:
        outer = _decoder.decode(body)
    top = outer.payload
    if outer.event_type is None or outer.publisher_id is None or outer.priority is None:
        raise Declined("envelope key missing")
    if top is None:
        raise Declined("payload missing")
    model = _TOPS.get(type(top)) or InstancePayload
    if top.namespace != model.OBJ_NAMESPACE:
        raise Declined("namespace")
    shaped = _SHAPED.get(type(top))
    if shaped is None:
        _check_version(model, top.version)
    else:
        _read_by_shape(top.version, top.data)
    finish(top.data)
    # Positional: a NamedTuple built from keywords costs twice as much.
    return FastNotification(
        outer.event_type,
        _event_type(outer.event_type),
        _priority(outer.priority),
        envelope_time(outer.timestamp),
        outer.message_id,
        model,
        shaped or model.OBJ_NAME,
        top.version,
        top.data,
    )


# Parsed once per distinct value: a stream carries a few dozen event types.
_event_type = functools.lru_cache(maxsize=1024)(EventType.parse)
_priority = functools.lru_cache(maxsize=64)(Priority.parse)

_VERSION = re.compile(r"([0-9]+)\.([0-9]+)")


_versions_ok: set[tuple[type[VersionedObject], str]] = set()


def _check_version(model: type[VersionedObject], version: str) -> None:
    if (model, version) in _versions_ok:
        return
    got = _VERSION.fullmatch(version)
    if got is not None and len(version) > limits.ENVELOPE_LENGTH:
        raise Declined("version")  # the reference names it out of range
    known_major, known_minor = map(int, model.OBJ_VERSION.split("."))
    if got is None or int(got[1]) != known_major:
        raise Declined("version")
    if (
        int(got[2]) > known_minor
        and (model.OBJ_NAME, version) not in _seen_newer
        and len(_seen_newer) < LOGGED_VERSIONS  # past that the reference logs none
    ):
        # The reference logs the fields a newer minor adds, once per version.
        _seen_newer.add((model.OBJ_NAME, version))
        raise Declined("first newer minor")
    if len(_versions_ok) < 4096:
        _versions_ok.add((model, version))


_ANY_VERSION = re.compile(r"[0-9]+\.[0-9]+")


def _read_by_shape(version: str, data: Any) -> None:
    """As the registry reads a class it does not know: any ``major.minor`` version, an
    instance snapshot only if the data carries more than half of InstancePayload's
    ``SHAPE_FIELDS``; the absent ones then get the model's defaults."""
    if _ANY_VERSION.fullmatch(version) is None:
        raise Declined("version")
    values = _get_shape_optional(data)
    # Counted in C: a full snapshot (the common case) has none absent.
    if not values.count(msgspec.UNSET):
        return
    absent = [name for name, v in zip(_SHAPE_OPTIONAL, values, strict=True) if v is msgspec.UNSET]
    shape = len(InstancePayload.SHAPE_FIELDS)
    if (shape - len(absent)) * 2 <= shape:
        raise Declined("not an instance snapshot's shape")
    for name in absent:
        setattr(data, name, _DEFAULTS[name]())
