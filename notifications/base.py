"""Versioned objects on the wire.

Every payload travels as ``{"nova_object.name", "nova_object.namespace",
"nova_object.version", "nova_object.data"}``, nested objects included. The base class
below unwraps that shape on validation and wraps it again on serialization, so a
payload model is an ordinary pydantic model whose JSON form is the wire form.

Version rules (DESIGN.md): same major and a newer minor is accepted, unknown fields
kept on the object (``model_extra``) and logged once; an older minor fills defaults;
another major raises :class:`UnknownMajorVersion`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from cellsight.notifications import limits
from cellsight.notifications.bounds import bound_checks, schema_with_bounds
from cellsight.notifications.errors import (
    MalformedNotification,
    OutOfRange,
    UnknownMajorVersion,
    brief,
)
from cellsight.notifications.forms import AS_STORED

log = logging.getLogger(__name__)

NAME = "nova_object.name"
NAMESPACE = "nova_object.namespace"
VERSION = "nova_object.version"
DATA = "nova_object.data"
WIRE_KEYS = frozenset({NAME, NAMESPACE, VERSION, DATA})

_logged_unknown: set[tuple[str, str]] = set()
LOGGED_VERSIONS = 4096
"""Newer minor versions whose unknown fields are logged (once each); past that, none: a
stream of ever new versions must not grow memory or the log without end."""


def format_timestamp(value: datetime) -> str:
    """Nova's wire form (``2012-10-29T13:42:11Z``), keeping microseconds when present.

    Full precision matters: the indexer orders events by these timestamps.
    """
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    # isoformat, not strftime: 4-digit years below 1000 too, and 5x faster.
    return value.isoformat() + "Z"


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC (naive means UTC); a time that leaves years 1..9999 when
    normalised (``9999-12-31T23:59:59-01:00``) is a named error, not ``OverflowError``."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise PydanticCustomError(
            "out_of_range",
            "time {value} is outside years 1..9999 once normalised to UTC",
            {"value": value.isoformat()},
        ) from None


# The exported schema's times: RFC 3339 as Nova writes it (``T``, an offset or ``Z``, up
# to six digits of fraction), each part in its range and each date real (February 29th
# in leap years only), none that leaves years 1..9999 in UTC (the two days at the ends
# with an offset that could): never looser than the decoder, whether or not a validator
# checks ``format``. ``$(?!\n)``: Python's ``$`` also matches before a final newline.
_LEAP = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = (
    r"(?!0000)(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
    rf"|{_LEAP}-02-29)"
)
_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_ENDS = r"(?!0001-01-01T[0-9:.]*\+(?!00:00))(?!9999-12-31T[0-9:.]*-(?!00:00))"
TIME_SCHEMA_PATTERN = rf"^{_ENDS}{_DATE}T{_CLOCK}{_OFFSET}$(?!\n)"


def _time_as_text(value: Any) -> Any:
    """A time must come as text (or a ``datetime``, from Cellsight's own producer), as
    Nova's ``DateTimeField`` takes it: pydantic alone reads a number as Unix time, so
    ``1500000000.0`` was indexed as 2017 where Nova's own objects refuse it."""
    if isinstance(value, str | datetime):
        return value
    raise PydanticCustomError(
        "datetime_type",
        "Input should be a time in ISO 8601 text, not {kind}",
        {"kind": type(value).__name__},
    )


Timestamp = Annotated[
    datetime,
    BeforeValidator(_time_as_text),
    AfterValidator(as_utc),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "pattern": TIME_SCHEMA_PATTERN}),
]
"""A timezone-aware UTC datetime that serializes in Nova's format."""


UUID_PATTERN = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
"""A UUID as Nova writes it: 8-4-4-4-12 hex digits (``uuid.UUID`` also reads braces,
``urn:uuid:`` and 32 bare digits, which would index one instance under several ids)."""
_UUID = re.compile(UUID_PATTERN)


def _check_uuid(value: str) -> str:
    if not _UUID.fullmatch(value):
        raise ValueError(f"{brief(value, 60)} is not a UUID of 8-4-4-4-12 hex digits")
    return value


UuidStr = Annotated[
    str,
    AfterValidator(_check_uuid),
    # The lengths too: a pattern's "$" also matches before a final newline in Python's re.
    WithJsonSchema(
        {"type": "string", "minLength": 36, "maxLength": 36, "pattern": f"^{UUID_PATTERN}$"}
    ),
]
"""A UUID kept as the producer wrote it, so a round trip is byte-equal."""


def parse_version(version: Any, where: str) -> tuple[int, int]:
    if not isinstance(version, str):
        raise MalformedNotification(
            f"{where}: {VERSION} must be a string like '1.9', got {brief(version, 60)}"
        )
    if len(version) > limits.ENVELOPE_LENGTH:
        raise OutOfRange(
            f"{where}: {VERSION} of {len(version)} characters is longer than "
            f"{limits.ENVELOPE_LENGTH}"
        )
    major, sep, minor = version.partition(".")
    # ASCII digits, as the exported schema's pattern says: isdigit() alone takes a
    # fullwidth "2" (read by int() as 2) and "²" (which int() refuses, in Python's words).
    if not (sep and (major + minor).isascii() and major.isdigit() and minor.isdigit()):
        raise MalformedNotification(f"{where}: {VERSION} {brief(version, 60)} is not 'major.minor'")
    return int(major), int(minor)


class VersionedObject(BaseModel):
    """Base of every versioned payload object.

    Subclasses set ``OBJ_NAME``, ``OBJ_VERSION`` and ``OBJ_NAMESPACE``. An instance
    remembers the name and version it was read with, so an object decoded by shape
    (a class this code has never seen) serializes back under its own name.
    """

    # No ``str_max_length``: every string field's cap is ``_bounds``' (by its name), which
    # a cell's row read as stored (``forms.AS_STORED``) is not held to, where a core
    # setting could not be lifted: a sync indexed a row's 1 MB name that the API then
    # could not read back (an adversarial probe: a 500 for the server).
    model_config = ConfigDict(
        extra="ignore",
        populate_by_name=True,
        validate_assignment=False,
        allow_inf_nan=False,
    )

    OBJ_NAME: ClassVar[str] = "VersionedObject"
    OBJ_VERSION: ClassVar[str] = "1.0"
    OBJ_NAMESPACE: ClassVar[str] = "nova"

    _wire_name: str | None = None
    _wire_version: str | None = None
    _wire_namespace: str | None = None

    @property
    def obj_name(self) -> str:
        return self._wire_name or self.OBJ_NAME

    @property
    def obj_version(self) -> str:
        return self._wire_version or self.OBJ_VERSION

    @property
    def obj_namespace(self) -> str:
        return self._wire_namespace or self.OBJ_NAMESPACE

    # Where Nova's class declares again a field its base declared (InstanceActionPayload:
    # request_id), its own fields as Nova lists them, that one included: they come first.
    WIRE_REDECLARED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @functools.cache
    def wire_order(cls) -> tuple[str, ...]:
        """The data's keys in the order Nova sends them. oslo.versionedobjects'
        ``obj_to_primitive`` walks the class's ``fields`` dict, which holds the fields
        the class declares, in their order, then those of its bases not yet in it
        (``_make_class_properties``): a subclass's own fields come first. The models
        declare Nova's fields in Nova's order; Cellsight's extensions come after."""
        own = inspect.get_annotations(cls)  # this class's own, in declaration order
        redeclared = cls.__dict__.get("WIRE_REDECLARED", ())  # not inherited
        order = dict.fromkeys([*redeclared, *own])
        for base in cls.__mro__[1:]:
            if issubclass(base, VersionedObject):
                order.update(dict.fromkeys(base.wire_order()))
        return tuple(name for name in order if name in cls.model_fields)

    @classmethod
    def accepts_name(cls, name: str) -> bool:
        """Whether a nested field of this type may carry an object called ``name``."""
        return name == cls.OBJ_NAME

    @classmethod
    def accepts_namespace(cls, namespace: Any) -> bool:
        """oslo.versionedobjects reads an object, nested ones included, only of its
        class's project's namespace (``UnsupportedObjectError`` otherwise)."""
        return namespace == cls.OBJ_NAMESPACE

    @model_validator(mode="wrap")
    @classmethod
    def _unwrap(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(data, cls):
            return data
        if not (isinstance(data, dict) and DATA in data):
            # Plain field values (tests, the cells' rows) are accepted as they are.
            return handler(data)
        missing = WIRE_KEYS - data.keys()
        if missing:
            raise MalformedNotification(
                f"{cls.OBJ_NAME}: versioned object lacks {', '.join(sorted(missing))}"
            )
        name, version = data[NAME], data[VERSION]
        if not isinstance(name, str) or not cls.accepts_name(name):
            raise ValueError(f"expected a {cls.OBJ_NAME} object, got {brief(name, 60)}")
        if not cls.accepts_namespace(data[NAMESPACE]):
            raise ValueError(
                f"{name} of namespace {brief(data[NAMESPACE], 60)}, not {cls.OBJ_NAMESPACE}"
            )
        got_major, got_minor = parse_version(version, name)
        known_major, known_minor = parse_version(cls.OBJ_VERSION, cls.OBJ_NAME)
        if name == cls.OBJ_NAME and got_major != known_major:
            raise UnknownMajorVersion(name, version, cls.OBJ_VERSION)
        inner = data[DATA]
        if not isinstance(inner, dict):
            raise ValueError(f"{name} {version}: {DATA} must be an object")
        obj = handler(inner)
        obj._wire_name, obj._wire_version = name, version
        obj._wire_namespace = data[NAMESPACE]
        if name == cls.OBJ_NAME and got_minor > known_minor:
            cls._log_unknown_fields(name, version, inner)
        return obj

    @classmethod
    def _log_unknown_fields(cls, name: str, version: str, inner: dict[str, Any]) -> None:
        key = (name, version)
        if key in _logged_unknown or len(_logged_unknown) >= LOGGED_VERSIONS:
            return  # logged once per version, for a bounded number of versions
        _logged_unknown.add(key)
        unknown = sorted(set(inner) - set(cls.model_fields))
        log.info(
            "reading %s %s with the %s reader; fields kept out of documents: %s",
            name,
            version,
            cls.OBJ_VERSION,
            ", ".join(unknown) or "none",
        )

    @model_validator(mode="after")
    def _bounds(self, info: ValidationInfo) -> Self:
        """Bounds of ``cellsight.notifications.limits``: checked on the decoded values, once per
        object, so every field type stays as plain as its model declares it. A cell's row
        read as stored (``forms.AS_STORED``) is held to the numbers' alone: a sync indexes
        it past the lengths and counts (README, Limits), and the API must read it back;
        numbers past 64 bits or not finite no engine and no JSON encoder takes."""
        stored = bool(info.context and info.context.get(AS_STORED))
        for name, check in bound_checks(type(self), stored):
            value = getattr(self, name)
            if value is not None:
                problem = check(name, value)
                if problem is not None:
                    raise OutOfRange(f"{self.obj_name}: field {name}: {problem}")
        return self

    @model_serializer(mode="wrap")
    def _wrap(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # pydantic lists a subclass's fields after its bases'; Nova sends them first.
        return {
            NAME: self.obj_name,
            NAMESPACE: self.obj_namespace,
            VERSION: self.obj_version,
            DATA: wire_ordered(handler(self), type(self).wire_order()),
        }

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        data_schema = handler(core_schema)
        data_schema = schema_with_bounds(cls, handler.resolve_ref_schema(data_schema))
        major = cls.OBJ_VERSION.split(".")[0]
        return {
            "title": f"{cls.OBJ_NAME} {cls.OBJ_VERSION}",
            "type": "object",
            "required": sorted(WIRE_KEYS),
            "properties": {
                NAME: {"type": "string", "const": cls.OBJ_NAME},
                NAMESPACE: {"type": "string", "const": cls.OBJ_NAMESPACE},
                VERSION: {"type": "string", "pattern": rf"^{major}\.[0-9]+$"},
                DATA: data_schema,
            },
        }

    def to_primitive(self) -> dict[str, Any]:
        """The wire form as plain JSON types."""
        return self.model_dump(mode="json")

    @classmethod
    def from_primitive(cls, data: Any) -> Self:
        return cls.model_validate(data)


def wire_ordered(data: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """``data`` with its keys in the order Nova sends them (``order``: a class's
    ``wire_order``). Keys the class does not know come first, as oslo.versionedobjects
    puts a class's own fields before its base's: those of a class read by shape
    (``instance.exists``' InstanceExistsPayload, read as an InstancePayload) or of a
    newer minor's subclass."""
    known = set(order)
    own = [key for key in data if key not in known]
    return {key: data[key] for key in [*own, *order] if key in data}
