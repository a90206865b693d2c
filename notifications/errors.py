"""Named errors of the notification contract.

Each error carries a short machine ``reason`` (used as the dead-letter header and
in metrics labels) and a message that names the object, the version and the field.
"""

from __future__ import annotations


class NotificationError(Exception):
    """Base of every contract error."""

    reason = "invalid"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedNotification(NotificationError):
    """The bytes are not a notification: not JSON, a wrong field type, a missing field."""

    reason = "malformed"


class InvalidEnvelope(MalformedNotification):
    """The JSON is not a notification envelope (bare or oslo.messaging v2)."""

    reason = "invalid_envelope"


class InvalidEventType(MalformedNotification):
    """``event_type`` is not ``object.action[.phase]``."""

    reason = "invalid_event_type"


class MissingField(MalformedNotification):
    """A field the contract requires is absent or null (e.g. an instance without uuid)."""

    reason = "missing_field"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class OutOfRange(MalformedNotification):
    """A value outside the contract's bounds (see ``cellsight.notifications.limits``): a string or
    list too long, an integer beyond a signed 64-bit long, a time outside years 1..9999
    in UTC."""

    reason = "out_of_range"


class TooLarge(MalformedNotification):
    """The body is larger than ``limits.MAX_BODY_BYTES``; it was not parsed."""

    reason = "too_large"


class UnknownMajorVersion(NotificationError):
    """An object arrived with a major version this code cannot read."""

    reason = "unknown_major_version"

    def __init__(self, name: str, version: str, supported: str, where: str = "payload") -> None:
        super().__init__(
            f"{where}: {name} version {version} has major version "
            f"{version.split('.')[0]}, this reader supports {name} {supported} "
            f"(same major version only)"
        )
        self.name = name
        self.version = version
        self.supported = supported


class PublishError(NotificationError):
    """A notification could not be delivered to the bus; it was not silently dropped."""

    reason = "publish_failed"
