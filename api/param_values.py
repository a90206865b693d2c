"""One query parameter's values read as Nova reads them: booleans, times, limits,
power states, tags and regex filters, the last of a repeated one, each checked."""

from __future__ import annotations

import re
from datetime import datetime

from cellsight.api import status as st
from cellsight.api.change_times import BadDate, parse_change_time
from cellsight.api.errors import invalid_parameter
from cellsight.query.regex import validate as validate_regex
from cellsight.query.regex_syntax import MAX_LENGTH as MAX_REGEX_LENGTH
from cellsight.query.tree import (
    Compare,
    Contains,
    Exists,
    In,
    MatchNone,
    Node,
    Not,
    Op,
    Regex,
    conjunction,
    disjunction,
)

MAX_VALUE_LENGTH = 255

REGEX_FILTERS = {  # parameter → document field; Nova matches these as regexes
    "name": "display_name",
    "ip": "ip4",
    "ip6": "ip6",
    "node": "node",
    "availability_zone": "availability_zone",
    "key_name": "key_name",
    "reservation_id": "reservation_id",
    "hostname": "host_name",
    "kernel_id": "kernel_id",
    "ramdisk_id": "ramdisk_id",
    "display_description": "display_description",
}

_TRUE = frozenset({"1", "t", "true", "on", "y", "yes"})
_FALSE = frozenset({"0", "f", "false", "off", "n", "no"})


def parse_bool(param: str, value: str, default: bool | None = None) -> bool:
    """As oslo's ``bool_from_string``: a value that is no boolean is ``default``, or a 400
    without one (``strict``)."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    if default is not None:
        return default
    raise invalid_parameter(
        param, value, "Expected a boolean: one of 0, 1, f, false, n, no, off, on, t, true, y, yes."
    )


def parse_time(param: str, value: str) -> datetime:
    """One ``changes-since``/``changes-before`` value, as Nova reads it (in UTC)."""
    try:
        return parse_change_time(value)
    except BadDate as exc:
        raise invalid_parameter(param, value, str(exc)) from None


def last_time(param: str, values: list[str]) -> datetime:
    # As Nova: its schema checks every value of the repeated parameter, and the last
    # one is used (``search_opts.update(req.GET)`` takes webob's last value).
    times = [parse_time(param, checked(param, value)) for value in values]
    return times[-1]


def check_regex(param: str, pattern: str) -> str:
    """Bounded and portable, or a 400: the same pattern runs in every cell and engine."""
    if len(pattern) > MAX_REGEX_LENGTH:
        raise invalid_parameter(
            param, pattern, f"A pattern is at most {MAX_REGEX_LENGTH} characters."
        )
    try:
        validate_regex(pattern)
    except ValueError as exc:
        raise invalid_parameter(param, pattern, f"Invalid regular expression: {exc}") from None
    return pattern


def one(param: str, values: list[str]) -> str:
    # Like Nova (webob's MultiDict), the last of a repeated single-valued parameter wins.
    return checked(param, values[-1])


def regex_filter(param: str, field: str, pattern: str) -> Node:
    """Nova's database regex filter: a pattern with nothing but anchors matches as the
    databases' operators match it (any value that is not null; ``^$`` the empty one)."""
    if pattern in ("", "^", "$"):
        return Exists(field)
    if pattern == "^$":
        return Compare(field, Op.EQ, "")
    return Regex(field, check_regex(param, pattern))


def last(param: str, values: list[str]) -> str:
    """The last value, stripped, every value checked: Nova's schema checks each value of
    a repeated parameter and its ``search_opts`` keep webob's last."""
    for value in values[:-1]:
        checked(param, value)
    return checked(param, values[-1]).strip()


def checked(param: str, value: str) -> str:
    if len(value) > MAX_VALUE_LENGTH and param not in REGEX_FILTERS:
        raise invalid_parameter(param, value, f"At most {MAX_VALUE_LENGTH} characters.")
    if "\x00" in value:
        raise invalid_parameter(param, value, "NUL characters are not allowed.")
    return value


def tags_of(value: str) -> list[str]:
    """As Nova (2.26+): split on commas and nothing else. No strip, since a tag may begin
    or end with spaces; an empty one is kept, and as no instance has an empty tag,
    ``tags=`` lists nothing and ``not-tags=`` filters nothing, as Nova's database query
    answers them."""
    return value.split(",")


_LIMIT = re.compile(r"[0-9]+\n?")


def parse_limit(values: list[str] | None, max_limit: int) -> int:
    if values is None:
        return max_limit
    # Nova's schema: each value matches ``^[0-9]*$`` (Python's ``$``: a final newline
    # passes) with at least one character; the last one is used.
    for raw in values:
        if _LIMIT.fullmatch(raw) is None:
            raise invalid_parameter("limit", raw, "limit must be a non-negative integer.")
    value = values[-1].rstrip("\n")
    digits = value.lstrip("0") or "0"
    # Nova caps a limit at its maximum; a huge one is capped without converting it.
    if len(digits) > len(str(max_limit)):
        return max_limit
    return min(int(digits), max_limit)


def power_states(values: list[str]) -> Node:
    """The last value's power state (Nova's ``search_opts`` keep the last of a repeated
    parameter), every value checked as its schema checks each."""
    name = [_power_state(value) for value in values][-1]
    return In("power_state", (name,)) if name is not None else MatchNone()


def _power_state(value: str) -> str | None:
    """A number (0-7) or a name; a number no state has is None (nothing matches it)."""
    text = value.strip().lower()
    if text.isdigit() and text.isascii():
        digits = text.lstrip("0") or "0"
        return st.POWER_STATES.get(int(digits)) if len(digits) < 4 else None
    if text in st.POWER_STATE_NUMBERS:
        return text
    raise invalid_parameter("power_state", value, "Expected a power state number (0-7) or name.")


def tag_clauses(params: dict[str, list[str]]) -> list[Node]:
    out: list[Node] = []
    if "tags" in params:
        tags = tags_of(one("tags", params["tags"]))
        out.append(conjunction(*(Contains("tags", t) for t in tags)))
    if "tags-any" in params:
        tags = tags_of(one("tags-any", params["tags-any"]))
        out.append(disjunction(*(Contains("tags", t) for t in tags)))
    if "not-tags" in params:
        tags = tags_of(one("not-tags", params["not-tags"]))
        out.append(Not(conjunction(*(Contains("tags", t) for t in tags))))
    if "not-tags-any" in params:
        tags = tags_of(one("not-tags-any", params["not-tags-any"]))
        out.append(Not(disjunction(*(Contains("tags", t) for t in tags))))
    return out
