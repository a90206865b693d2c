"""Named errors of the notification contract.

Each error carries a short machine ``reason`` (used as the dead-letter header and
in metrics labels) and a message that names the object, the version and the field.
"""

from __future__ import annotations

import re
import reprlib
from datetime import datetime
from typing import Any

# Two levels deep and a few items a level: the repr of a value nested 1,000 deep would
# exceed the recursion limit, and a megabyte string's would be a megabyte.
_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxdict, _BRIEF.maxlist = 2, 4, 4
_BRIEF.maxstring = _BRIEF.maxother = _BRIEF.maxlong = 80


def clip(text: str, width: int = 80) -> str:
    """``text`` for an error message: at most ``width`` characters, "..." marking a cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


def encodable(text: str) -> bool:
    """Whether UTF-8 can hold ``text``: JSON's ``\\ud800`` escape makes a lone surrogate,
    which no Redis client can send. (``query.prepare.encodable`` is its twin: the query
    layer may import no other part, nor this one the query layer.)"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped(text: str) -> str:
    """``text`` with what UTF-8 cannot hold (a lone surrogate quoted from bad input)
    written as its escape, so that it can be sent and printed."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def plural(n: int, noun: str) -> str:
    """``n noun`` for a message, the (regular) noun plural unless ``n`` is one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def brief(value: Any, width: int = 80) -> str:
    """A value for an error message: at most ``width`` characters of its repr, and an
    integer past 64 bits by its size (the repr of one past 4,300 digits raises)."""
    if type(value) is int and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = _BRIEF.repr(value)
    except (ValueError, RecursionError):  # such an integer inside a list or a dict
        text = f"a {type(value).__name__}"
    return text[:width]


# hh:mm:60, with an optional fraction: ISO 8601 allows a leap second, Python's datetime
# (and so Nova, which writes its times with it) cannot hold one.
_LEAP_SECOND = re.compile(r"(?:^|[T ])\d{2}:\d{2}:60(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?$")


def time_problem(value: Any, parser_says: str) -> str:
    """Why a time was refused: a leap second by name (the parsers' own words for one are
    "unexpected extra characters" or nothing at all), otherwise what the parser said."""
    found = _LEAP_SECOND.search(value.strip()) if isinstance(value, str) else None
    if found is not None and _valid_but_for_second_60(found.string, found.end()):
        return "a leap second (second 60), which no Python datetime, Nova's included, holds"
    return parser_says


def _valid_but_for_second_60(text: str, end: int) -> bool:
    """Whether ``text`` is a valid time once its second 60 reads 59: a month 13 with
    second 60 is refused for its month, not its second (a review)."""
    at = text.rindex(":60", 0, end)
    try:
        datetime.fromisoformat(f"{text[:at]}:59{text[at + 3 :]}")
    except ValueError:
        return False
    return True


class NotificationError(Exception):
    """Base of every contract error."""

    reason = "invalid"
    # The envelope's event type, when it was read before the error (a dead letter names it).
    event_type: str | None = None

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
