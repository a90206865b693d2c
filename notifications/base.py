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

import logging
import uuid as uuidlib
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema

from notifications.errors import MalformedNotification, UnknownMajorVersion

log = logging.getLogger(__name__)

NAME = "nova_object.name"
NAMESPACE = "nova_object.namespace"
VERSION = "nova_object.version"
DATA = "nova_object.data"
WIRE_KEYS = frozenset({NAME, NAMESPACE, VERSION, DATA})

_logged_unknown: set[tuple[str, str]] = set()


def format_timestamp(value: datetime) -> str:
    """Nova's wire form (``2012-10-29T13:42:11Z``), keeping microseconds when present.

    Full precision matters: the indexer orders events by these timestamps.
    """
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    if value.microsecond:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Timestamp = Annotated[
    datetime,
    AfterValidator(_as_utc),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
]
"""A timezone-aware UTC datetime that serializes in Nova's format."""


def _check_uuid(value: str) -> str:
    try:
        uuidlib.UUID(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a UUID") from None
    return value


UuidStr = Annotated[str, AfterValidator(_check_uuid)]
"""A UUID kept as the producer wrote it, so a round trip is byte-equal."""


def parse_version(version: Any, where: str) -> tuple[int, int]:
    if not isinstance(version, str):
        raise MalformedNotification(
            f"{where}: {VERSION} must be a string like '1.9', got {version!r}"
        )
    major, sep, minor = version.partition(".")
    if not (sep and major.isdigit() and minor.isdigit()):
        raise MalformedNotification(f"{where}: {VERSION} {version!r} is not 'major.minor'")
    return int(major), int(minor)


class VersionedObject(BaseModel):
    """Base of every versioned payload object.

    Subclasses set ``OBJ_NAME``, ``OBJ_VERSION`` and ``OBJ_NAMESPACE``. An instance
    remembers the name and version it was read with, so an object decoded by shape
    (a class this code has never seen) serializes back under its own name.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, validate_assignment=False)

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

    @classmethod
    def accepts_name(cls, name: str) -> bool:
        """Whether a nested field of this type may carry an object called ``name``."""
        return name == cls.OBJ_NAME

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
            raise ValueError(f"expected a {cls.OBJ_NAME} object, got {name!r}")
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
        if key in _logged_unknown:
            return
        _logged_unknown.add(key)
        unknown = sorted(set(inner) - set(cls.model_fields))
        log.info(
            "reading %s %s with the %s reader; fields kept out of documents: %s",
            name,
            version,
            cls.OBJ_VERSION,
            ", ".join(unknown) or "none",
        )

    @model_serializer(mode="wrap")
    def _wrap(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {
            NAME: self.obj_name,
            NAMESPACE: self.obj_namespace,
            VERSION: self.obj_version,
            DATA: handler(self),
        }

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        data_schema = handler(core_schema)
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
