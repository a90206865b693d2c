"""What a name or an id may hold: Nova's API allows printable characters in names (its
``parameter_types.name`` pattern): no code point of Unicode's category C (control,
format, surrogate, private use, unassigned) and no line or paragraph separator; spaces
are printable; and at most 255 characters (Nova's ``String(255)``). One rule for the
API's bodies, the CLI's options and the operations."""

from __future__ import annotations

import unicodedata

from cellsight.cells.errors import BlankText, InvalidText, TextTooLong
from cellsight.notifications.limits import NAME_LENGTH


def unprintable(value: str) -> str | None:
    """The first character of ``value`` that names may not hold, or None."""
    if value.isprintable():  # Python's rule refuses all that Nova's does, and more
        return None
    for char in value:
        category = unicodedata.category(char)
        if category[0] == "C" or category in ("Zl", "Zp"):
            return char
    return None


def check_text(field: str, value: str | None) -> None:
    """``InvalidText`` naming ``field`` if ``value`` holds what names may not,
    ``TextTooLong`` if it is longer than a name may be."""
    if value is None:
        return
    if len(value) > NAME_LENGTH:
        raise TextTooLong(field, value, NAME_LENGTH)
    if (char := unprintable(value)) is not None:
        raise InvalidText(field, value, char)


def check_name(field: str, value: str) -> None:
    """``check_text`` of a name that must be given: ``BlankText`` if it is blank."""
    if not value.strip():
        raise BlankText(field)
    check_text(field, value)


def check_given(**values: object) -> None:
    """``check_name`` for each string of ``values``, in order: a value given must not be
    blank (``''`` never means "the default" or "none"; an omitted one, None or a
    caller's "not given" marker, is not a name and passes)."""
    for field, value in values.items():
        if isinstance(value, str):
            check_name(field, value)


def check_length(field: str, value: str) -> None:
    """``TextTooLong`` only: for values that may hold any character (metadata)."""
    if len(value) > NAME_LENGTH:
        raise TextTooLong(field, value, NAME_LENGTH)
