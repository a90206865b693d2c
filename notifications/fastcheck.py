"""What the compiled decode (:mod:`cellsight.notifications.fastdecode`) checks after
msgspec's pass: UUID and time texts matched to the forms the reference reads alike,
times read and put in UTC, IP addresses and server tags checked by the reference's own
rules (:mod:`cellsight.notifications.forms`).

The patterns are matched here, not by msgspec: msgspec calls a pattern's ``search``
through ``PyObject_CallMethod``, whose argument tuple and keyword parsing cost more than
the match itself (about 24,000 instructions a notification of the indexer benchmark's
kinds for its four matches, under callgrind). msgspec checks only the lengths, in C,
and the lengths tell these kinds of text apart from every other string field: no
other has a minimum length.

Like the rest of the compiled path, nothing here decides that a message is bad: a text
it does not read raises :class:`Declined`, and the reference decoder decides.
"""

from __future__ import annotations

import re
import types
import typing
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from cellsight.notifications import limits
from cellsight.notifications.base import UUID_PATTERN
from cellsight.notifications.envelope import _parse_timestamp
from cellsight.notifications.forms import TAG_FORBIDDEN, ip_version, is_mac

UuidText = Annotated[str, Meta(min_length=36, max_length=36)]
TimeText = Annotated[str, Meta(min_length=19, max_length=32)]
# "::" to "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255": a text out of these lengths is
# no address, and the reference names it.
IpText = Annotated[str, Meta(min_length=2, max_length=45)]
MacText = Annotated[str, Meta(min_length=17, max_length=17)]
TagText = Annotated[str, Meta(min_length=1, max_length=limits.TAG_LENGTH)]
TagsText = Annotated[list[TagText], Meta(max_length=limits.MAX_TAGS)]
TIME_PATTERN = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})?"
)
uuid_ok = re.compile(UUID_PATTERN).fullmatch
time_ok = re.compile(TIME_PATTERN).fullmatch
# Nova's own forms (``2012-10-29T13:42:11Z``, with six digits of fraction or none) are
# told by the separators at 4, 7, 10, 13, 16 and 19 and the final Z, at a third of the
# pattern's cost: fromisoformat then refuses any non-digit between them, so what passes
# is what the pattern passes. Every other form is matched by the pattern.
_NOVA_LAYOUTS = {20: "--T::Z", 27: "--T::."}
_fromisoformat = datetime.fromisoformat


class Declined(Exception):
    """The fast path does not decide this message; the reference decoder will."""


# What ``finish`` does with a field: match its text (a UUID, a time, an IP or MAC address,
# each of its tags) or go into the nested object(s) it holds.
_UUID, _TIME, _IP, _MAC, _TAGS, _OBJECT, _LIST = range(7)


def _item(kind: Any) -> tuple[Any, bool]:
    """A field's type without ``None`` (or UNSET), and whether it is a list: then the
    type of its items."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    bare = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
    if typing.get_origin(bare) is list:
        return typing.get_args(bare)[0], True
    return kind, False


def _steps(struct: type[Struct]) -> list[tuple[int, str]]:
    """The fields of a data Struct that ``finish`` looks at, each with what it does."""
    steps: list[tuple[int, str]] = []
    for info in msgspec.structs.fields(struct):
        kind, many = _item(info.type)
        if kind == UuidText:
            steps.append((_UUID, info.name))
        elif kind == TimeText:
            steps.append((_TIME, info.name))
        elif kind == IpText:
            steps.append((_IP, info.name))
        elif kind == MacText:
            steps.append((_MAC, info.name))
        elif kind == TagText and many:
            steps.append((_TAGS, info.name))
        elif isinstance(kind, type) and issubclass(kind, Struct):
            # A nested object's wrapper: its data Struct is its ``data`` field.
            data = next(f.type for f in msgspec.structs.fields(kind) if f.name == "data")
            if _steps(data):
                steps.append((_LIST if many else _OBJECT, info.name))
    return steps


_STEPS: dict[type, list[tuple[int, str]]] = {}


def finish(data: Any) -> None:
    """Match the UUIDs, times, IP and MAC addresses and tags of a data Struct and of the
    objects in it (``Declined`` if one is not of the forms read here), put times in UTC
    (naive means UTC), as the reference's ``Timestamp`` does; a time that leaves years
    1..9999 in UTC raises ``OverflowError`` (the reference names it)."""
    steps = _STEPS.get(type(data))
    if steps is None:
        steps = _STEPS[type(data)] = _steps(type(data))
    # One loop over the fields that need it, inline: this runs for every time, address
    # and tag of every notification (a nested address is a call of its own).
    for step, name in steps:
        value = getattr(data, name)
        if value is None:
            continue
        if step == _TIME:
            if (value[-1] != "Z" or value[4:20:3] != _NOVA_LAYOUTS.get(len(value))) and (
                time_ok(value) is None
            ):
                raise Declined(name)
            parsed = _fromisoformat(value)
            if parsed.tzinfo is not UTC:  # "Z" and "+00:00" (Nova's forms) parse to UTC
                parsed = (
                    parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
                )
            setattr(data, name, parsed)
        elif step == _UUID:
            if uuid_ok(value) is None:
                raise Declined(name)
        elif step == _IP:
            if ip_version(value) is None:
                raise Declined(name)
        elif step == _MAC:
            if not is_mac(value):
                raise Declined(name)
        elif step == _TAGS:
            # msgspec checked each tag's length and their count (``TagsText``); what is
            # left of ``tag_problem`` is the characters, looked for in all tags at once.
            joined = "".join(value)
            for forbidden in TAG_FORBIDDEN:
                if forbidden in joined:
                    raise Declined(name)
        elif step == _OBJECT:
            finish(value.data)
        else:
            for wrapper in value:
                finish(wrapper.data)


def envelope_time(text: str | None) -> datetime | None:
    """The envelope's time as the reference reads it (``_parse_timestamp``).
    oslo.messaging writes it naive, in UTC, in 26 characters: read with ``+00:00``
    appended, it parses to UTC itself, where the reference's ``replace(tzinfo=UTC)``
    costs 9,000 instructions (its keywords are parsed). fromisoformat refuses the text
    unless its six characters after the dot are digits, so an accepted one had no
    offset; any other text gets the reference's answer."""
    if text is not None and len(text) == 26 and text[4:20:3] == "-- ::.":
        try:
            return _fromisoformat(text + "+00:00")
        except ValueError:
            pass  # the reference gives its verdict
    return _parse_timestamp(text)
