"""The dates of ``changes-since`` and ``changes-before``, read as Nova reads them.

Nova validates every value of these (repeatable) parameters with its ``date-time``
format checker (``nova/api/validation/validators.py``), which is oslo's
``timeutils.parse_isotime``: the ``iso8601`` library's ``parse_date`` with UTC as the
default zone. ``_get_servers`` then uses the last value (``search_opts.update(req.GET)``
takes webob's last one). So the same library reads them here: partial dates
(``2025-06`` is 2025-06-01T00:00:00 UTC), a space for the ``T``, a zone or none.

Not Nova's: the instant, converted to UTC, must lie within years 1 to 9999 (Nova's
``normalize_time`` would fail on it), and a value is at most ``MAX_DATE_LENGTH``
characters.
"""

from __future__ import annotations

from datetime import UTC, datetime

import iso8601

MAX_DATE_LENGTH = 64


class BadDate(ValueError):
    """Not a date-time Nova accepts; the message is fit for a client."""


class OutOfRange(BadDate):
    """A date-time Nova accepts whose UTC instant is outside years 1 to 9999."""


def parse_change_time(value: str) -> datetime:
    """``value`` as an aware UTC datetime, or ``BadDate``."""
    if len(value) > MAX_DATE_LENGTH:
        raise BadDate(f"Expected an ISO 8601 date-time of at most {MAX_DATE_LENGTH} characters.")
    try:
        parsed = iso8601.parse_date(value, default_timezone=UTC)
    except (iso8601.ParseError, TypeError, ValueError, OverflowError):
        # The library's message quotes the value and its internals: a fixed one instead.
        raise BadDate(
            "Expected an ISO 8601 date-time such as 2025-06-01T12:00:00Z or 2025-06."
        ) from None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise OutOfRange("The date-time, converted to UTC, is outside years 1 to 9999.") from None
