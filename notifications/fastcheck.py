"""What the compiled decode (:mod:`cellsight.notifications.fastdecode`) checks after
msgspec's pass: UUID and time texts matched to the forms the reference reads alike,
times read and put in UTC.

The patterns are matched here, not by msgspec: msgspec calls a pattern's ``search``
through ``PyObject_CallMethod``, whose argument tuple and keyword parsing cost more than
the match itself (about 24,000 instructions a notification of the indexer benchmark's
kinds for its four matches, under callgrind). msgspec checks only the lengths, in C,
and the lengths tell the two kinds of text apart from every other string field: no
other has a minimum length.

Like the rest of the compiled path, nothing here decides that a message is bad: a text
it does not read raises :class:`Declined`, and the reference decoder decides.
"""

from __future__ import annotations

import re
import types
import typing
from datetime import UTC, datetime
from typing import Annotated, Any, NamedTuple

import msgspec
from msgspec import Meta, Struct

from cellsight.notifications.base import UUID_PATTERN
from cellsight.notifications.envelope import _parse_timestamp

UuidText = Annotated[str, Meta(min_length=36, max_length=36)]
TimeText = Annotated[str, Meta(min_length=19, max_length=32)]
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


class _Checks(NamedTuple):
    """What ``finish`` does to a data Struct: the fields whose text it matches, and the
    nested objects (one, or a list of them) it goes into."""

    uuids: list[str]
    times: list[str]
    objects: list[str]
    lists: list[str]


def _item(kind: Any) -> tuple[Any, bool]:
    """A field's type without ``None`` (or UNSET), and whether it is a list: then the
    type of its items."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    bare = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
    if typing.get_origin(bare) is list:
        return typing.get_args(bare)[0], True
    return kind, False


def _checks(struct: type[Struct]) -> _Checks:
    checks = _Checks([], [], [], [])
    for info in msgspec.structs.fields(struct):
        kind, many = _item(info.type)
        if kind == UuidText:
            checks.uuids.append(info.name)
        elif kind == TimeText:
            checks.times.append(info.name)
        elif isinstance(kind, type) and issubclass(kind, Struct):
            # A nested object's wrapper: its data Struct is its ``data`` field.
            data = next(f.type for f in msgspec.structs.fields(kind) if f.name == "data")
            if any(_checks(data)):
                (checks.lists if many else checks.objects).append(info.name)
    return checks


_CHECKS: dict[type, _Checks] = {}


def finish(data: Any) -> None:
    """Match the UUIDs and times of a data Struct and the objects in it (``Declined``
    if one is not of the forms read here), and put the times in UTC (naive means UTC),
    as the reference's ``Timestamp`` does; a time that leaves years 1..9999 in UTC
    raises ``OverflowError`` (the reference names it)."""
    checks = _CHECKS.get(type(data))
    if checks is None:
        checks = _CHECKS[type(data)] = _checks(type(data))
    # Inline: this runs for every time of every notification.
    for name in checks.uuids:
        value = getattr(data, name)
        if value is not None and uuid_ok(value) is None:
            raise Declined(name)
    for name in checks.times:
        text = getattr(data, name)
        if text is not None:
            if (text[-1] != "Z" or text[4:20:3] != _NOVA_LAYOUTS.get(len(text))) and (
                time_ok(text) is None
            ):
                raise Declined(name)
            value = _fromisoformat(text)
            if value.tzinfo is not UTC:  # "Z" and "+00:00" (Nova's forms) parse to UTC itself
                value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            setattr(data, name, value)
    for name in checks.objects:
        wrapper = getattr(data, name)
        if wrapper is not None:
            finish(wrapper.data)
    for name in checks.lists:
        for wrapper in getattr(data, name) or ():
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
