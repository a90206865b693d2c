"""The notification envelope: bare form and the oslo.messaging v2 wrapper."""

from __future__ import annotations

import json
import uuid as uuidlib
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from cellsight.notifications import wire
from cellsight.notifications.base import Timestamp, VersionedObject, format_timestamp
from cellsight.notifications.errors import (
    InvalidEnvelope,
    InvalidEventType,
    NotificationError,
    OutOfRange,
    brief,
    time_problem,
)
from cellsight.notifications.limits import ENVELOPE_LENGTH
from cellsight.notifications.registry import decode_payload

OSLO_VERSION = "2.0"
PHASES = frozenset({"start", "end", "error", "progress"})


class Priority(StrEnum):
    AUDIT = "AUDIT"
    CRITICAL = "CRITICAL"
    DEBUG = "DEBUG"
    INFO = "INFO"
    ERROR = "ERROR"
    SAMPLE = "SAMPLE"
    WARN = "WARN"

    @classmethod
    def parse(cls, value: str) -> Priority:
        upper = value.upper()
        if upper == "WARNING":
            return cls.WARN
        try:
            return cls(upper)
        except ValueError:
            raise InvalidEnvelope(
                f"priority {value!r} is not one of {', '.join(p.value for p in cls)}"
            ) from None

    @property
    def routing_key(self) -> str:
        return f"versioned_notifications.{self.value.lower()}"


class EventType(NamedTuple):
    object: str
    action: str
    phase: str | None

    @classmethod
    def parse(cls, value: str) -> EventType:
        parts = value.split(".") if isinstance(value, str) else []
        if len(parts) == 3 and parts[2] not in PHASES:
            raise InvalidEventType(
                f"event_type {value!r}: phase {parts[2]!r} is not one of "
                f"{', '.join(sorted(PHASES))}"
            )
        if len(parts) not in (2, 3) or not all(parts):
            raise InvalidEventType(f"event_type {value!r} is not object.action[.phase]")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def __str__(self) -> str:
        return ".".join(p for p in self if p)


class Notification(BaseModel):
    """One versioned notification. ``timestamp`` and ``message_id`` are set when
    published; files in the bare form may omit them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    event_type: str
    publisher_id: str
    priority: Priority
    payload: VersionedObject
    timestamp: Timestamp | None = None
    message_id: str | None = None

    @field_validator("event_type")
    @classmethod
    def _event_type(cls, value: str) -> str:
        EventType.parse(value)
        return value

    @property
    def event(self) -> EventType:
        return EventType.parse(self.event_type)

    @classmethod
    def create(
        cls,
        event_type: str,
        publisher_id: str,
        payload: VersionedObject,
        priority: Priority = Priority.INFO,
    ) -> Notification:
        return cls(
            event_type=event_type,
            publisher_id=publisher_id,
            priority=priority,
            payload=payload,
            timestamp=datetime.now(UTC),
            message_id=str(uuidlib.uuid4()),
        )

    def to_dict(self) -> dict[str, Any]:
        """The bare form; optional keys appear only when set, so samples round-trip."""
        out: dict[str, Any] = {
            "event_type": self.event_type,
            "publisher_id": self.publisher_id,
            "priority": self.priority.value,
            "payload": self.payload.to_primitive(),
        }
        if self.timestamp is not None:
            # oslo.messaging writes "2012-10-29 13:42:11.123456"; Nova's format is read too.
            out["timestamp"] = format_timestamp(self.timestamp)
        if self.message_id is not None:
            out["message_id"] = self.message_id
        return out

    def to_oslo(self) -> dict[str, Any]:
        """The oslo.messaging v2 wrapper that travels on the bus."""
        return {"oslo.version": OSLO_VERSION, "oslo.message": json.dumps(self.to_dict())}


ENVELOPE_KEYS = frozenset({"event_type", "publisher_id", "priority", "payload"})


def unwrap(body: Any) -> dict[str, Any]:
    """The bare notification dict from a bare or oslo-wrapped body (dict, str or bytes)."""
    if isinstance(body, bytes | bytearray | memoryview | str):
        body = wire.parse(body)
    if not isinstance(body, dict):
        raise InvalidEnvelope(f"a notification is a JSON object, got {type(body).__name__}")
    if "oslo.message" in body:
        version = body.get("oslo.version")
        if version != OSLO_VERSION:
            raise InvalidEnvelope(
                f"oslo.version {version!r} is not supported (need {OSLO_VERSION!r})"
            )
        inner = body["oslo.message"]
        if not isinstance(inner, str):
            raise InvalidEnvelope("oslo.message must be the notification as a JSON string")
        body = wire.parse(inner, "oslo.message")
        if not isinstance(body, dict):
            raise InvalidEnvelope("oslo.message must hold a JSON object")
    missing = ENVELOPE_KEYS - body.keys()
    if missing:
        raise InvalidEnvelope(f"notification lacks {', '.join(sorted(missing))}")
    return body


def decode(body: Any) -> Notification:
    """Decode a notification from the bus or a file; raise a named error otherwise."""
    raw = unwrap(body)
    for key in ("event_type", "publisher_id", "priority", "message_id"):
        value = raw.get(key)
        if value is None and key == "message_id":
            continue
        if not isinstance(value, str):
            raise InvalidEnvelope(f"{key} must be a string, got {brief(value, 60)}")
        if len(value) > ENVELOPE_LENGTH:
            raise OutOfRange(f"{key} is {len(value)} characters, the limit is {ENVELOPE_LENGTH}")
    EventType.parse(raw["event_type"])
    try:
        return _decode_parts(raw)
    except NotificationError as exc:
        exc.event_type = raw["event_type"]
        raise


def _decode_parts(raw: dict[str, Any]) -> Notification:
    priority = Priority.parse(raw["priority"])
    payload = decode_payload(raw["payload"])
    try:
        return Notification(
            event_type=raw["event_type"],
            publisher_id=raw["publisher_id"],
            priority=priority,
            payload=payload,
            timestamp=_parse_timestamp(raw.get("timestamp")),
            message_id=raw.get("message_id"),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InvalidEnvelope(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def _parse_timestamp(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEnvelope(f"timestamp must be a string, got {brief(value, 40)}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        says = time_problem(value, "not an ISO 8601 time")
        raise InvalidEnvelope(f"timestamp {brief(value)} is {says}") from None
    try:
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:
        raise OutOfRange(
            f"timestamp {value!r} is outside years 1..9999 once normalised to UTC"
        ) from None
