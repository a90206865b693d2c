"""What kombu's Redis channel would fail on, found before it does.

kombu's Redis channel takes a message off its list, parses its JSON envelope and builds
its message before it records the message as unacknowledged. An envelope that fails on
the way (bytes that are not UTF-8 or not JSON, a ``{"__type__": ...}`` marker kombu's
JSON reader refuses, a shape its message cannot be built from) raised out of the
consumer's receive with the message already gone from Redis: the indexer stopped and
the message was lost. And a body under a ``compression`` header was decompressed whole,
however large.

:func:`readable` runs on each message what kombu will run: the parse, the message, the
record of it as unacknowledged, with the decompression bounded; it also refuses what
kombu would take but could not restore after its consumer died, or the consumer could
not dead-letter (:func:`_fault`). Cellsight's channel (``redis_transport``) replaces an
envelope that would fail by one kombu reads (:func:`quarantined`), whose body is the
original bytes and whose ``UNREADABLE_MARK`` says what failed; the indexer
dead-letters it ``malformed`` (``too_large`` for a bomb) with that reason, acks it, and
goes on. What it costs a readable message is measured in the README (Performance).
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from kombu.compression import get_decoder
from kombu.utils.json import dumps, loads

from cellsight.notifications.compression import BOUNDED_CODECS, bounded_decompress
from cellsight.notifications.errors import (
    MalformedNotification,
    TooLarge,
    brief,
    clip,
    encodable,
    escaped,
)
from cellsight.notifications.limits import MAX_BODY_BYTES
from cellsight.notifications.unreadable import (
    UNREADABLE_CODE_HEADER,
    UNREADABLE_HEADER,
    UNREADABLE_MARK,
)

__all__ = ["UnreadableEnvelope", "quarantined", "readable"]

MAX_NESTING = 512
# Lists and objects an envelope may hold, at most: more are refused unread (a walk of
# millions of them for their depth takes seconds of CPU).
MAX_CONTAINERS = 65_536


class UnreadableEnvelope(ValueError):
    """What kombu would fail on, named for the dead letter."""

    code = MalformedNotification.reason


class DecompressesTooLarge(UnreadableEnvelope):
    code = TooLarge.reason


def readable(channel: Any, item: bytes, queue: str) -> None:
    """Raises :class:`UnreadableEnvelope` where kombu would fail on ``item`` between
    taking it off ``queue``'s list and recording it as unacknowledged (``_brpop_read``,
    ``basic_consume``'s callback, ``QoS.append``), where its body decompresses past
    ``MAX_BODY_BYTES``, and where the envelope is not as kombu's producers write it in a
    way that would stop its consumer or lose it when kombu restores it (:func:`_fault`)."""
    brackets = item.count(b"{") + item.count(b"[")
    if brackets > MAX_CONTAINERS:
        # kombu's producers encode bodies in base64: their brackets are the headers'.
        raise UnreadableEnvelope(f"the envelope holds {brackets} brackets, over {MAX_CONTAINERS}")
    try:
        text = item.decode("utf-8")  # kombu would replace bad bytes: the body would change
    except UnicodeDecodeError as exc:
        raise UnreadableEnvelope(
            f"the envelope is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        payload = loads(text)
        if (fault := _fault(payload, queue)) is not None:
            raise UnreadableEnvelope(fault)
        codec = payload["headers"].get("compression")
        if isinstance(codec, str) and codec not in BOUNDED_CODECS and _kombu_reads(codec):
            # kombu would decompress it whole (zstd, brotli where installed).
            raise UnreadableEnvelope(f"compressed with {brief(codec, 40)}, unread past a bound")
        if codec and (body := payload["body"]):
            # Bounded here, so that kombu's own decompression, which follows, is too.
            body = channel.decode_body(body, payload["properties"].get("body_encoding"))
            try:
                size = len(bounded_decompress(body, codec, MAX_BODY_BYTES))
            except Exception:  # kombu fails too, and keeps it on the message's ``errors``:
                size = 0  # the consumer reads the body as it came (and dead-letters it)
            if size > MAX_BODY_BYTES:
                raise DecompressesTooLarge(
                    f"its body decompresses ({brief(codec, 40)}) past {MAX_BODY_BYTES} bytes"
                )
        channel.Message(payload, channel=channel)
        # What kombu's reader gives back its writer takes, but for nesting near the
        # interpreter's recursion limit, where one frame more or less decides (kombu
        # records it one level deeper, from another depth of the stack): refused here
        # well below it. Only an envelope with that many brackets is walked.
        if brackets > MAX_NESTING and _deeper(payload, MAX_NESTING):
            raise UnreadableEnvelope(f"the envelope is nested deeper than {MAX_NESTING} levels")
    except UnreadableEnvelope:
        raise
    except Exception as exc:  # kombu's parse and message raise whatever they meet
        raise UnreadableEnvelope(_why(exc)) from None


def _fault(payload: Any, queue: str) -> str | None:
    """What in ``payload`` is not as kombu's producers write it and would fail later:
    kombu's message or record of it (properties, delivery info, a tag redis-py cannot
    send), the consumer (a body that is no text, content names that are no text), or
    kombu's restore of it after its consumer died (headers that are no object, a
    priority that is no integer, an unnamed exchange whose routing key is not the
    queue, which restores it nowhere)."""
    if not isinstance(payload, dict):
        return f"the envelope is JSON {type(payload).__name__}, not an object"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return f"its properties are {_kind(properties)}, not an object"
    for name, value, kinds in (
        ("body", payload.get("body"), str),
        ("headers", payload.get("headers"), dict),
        ("delivery info", properties.get("delivery_info"), dict),
        ("delivery tag", properties.get("delivery_tag"), str),
        ("content type", payload.get("content-type"), str | None),
        ("content encoding", payload.get("content-encoding"), str | None),
        ("priority", properties.get("priority"), int | None),
    ):
        if not isinstance(value, kinds) or isinstance(value, bool):
            return f"its {name} is {_kind(value)}"
    tag, info = properties["delivery_tag"], properties["delivery_info"]
    if not tag or not tag.isprintable() or not encodable(tag):
        return f"its delivery tag {brief(tag, 60)} is not a printable, sendable string"
    exchange, key = info.get("exchange"), info.get("routing_key")
    if (exchange and not isinstance(exchange, str)) or not isinstance(key, str):
        return f"its delivery info names exchange {brief(exchange, 60)}, key {brief(key, 60)}"
    if not exchange and key != queue:
        return f"it names no exchange and routing key {brief(key, 60)}, not its queue's"
    return None


def _kombu_reads(codec: Any) -> bool:
    try:
        get_decoder(codec)
    except (KeyError, TypeError):
        return False
    return True


def _route(item: bytes, why: UnreadableEnvelope) -> tuple[str, str]:
    """(exchange, routing key) of the delivery info of ``item``, for a body that
    decompresses too large (its envelope passed every other check), if they are texts;
    else ``("", "")``: another unreadable envelope may not parse, or not cheaply."""
    if not isinstance(why, DecompressesTooLarge):
        return "", ""
    try:
        info = loads(item)["properties"]["delivery_info"]
        route = (info["exchange"], info["routing_key"])
    except (ValueError, TypeError, KeyError, RecursionError):  # no envelope with a route
        return "", ""
    return route if all(type(part) is str for part in route) else ("", "")


def _kind(value: Any) -> str:
    return "missing" if value is None else f"JSON {type(value).__name__}"


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _why(exc: Exception) -> str:
    """The error in a line: its type and its argument (bounded: a refused marker's
    argument holds the value kombu refused, nested however deep)."""
    what = exc.args[0] if len(exc.args) == 1 else exc.args
    text = clip(what, 200) if isinstance(what, str) else brief(what, 200)
    # A lone surrogate from the envelope would make the reason unsendable and unprintable.
    return f"{type(exc).__name__}: {escaped(text)}"


def quarantined(item: bytes, queue: str, why: UnreadableEnvelope) -> bytes:
    """An envelope kombu reads, carrying ``item`` whole and why it was unreadable. Its
    delivery info routes it back to ``queue`` (kombu restores it there if its consumer
    dies); the route it was published with, where ``item`` tells it (``_route``), goes in
    the mark, for its dead letter to be replayed by (``("", "")`` when unknown: replay's
    default)."""
    reason = f"the bus could not read the message: {why}"
    return dumps(
        {
            "body": base64.b64encode(item).decode("ascii"),
            "content-encoding": "binary",
            "content-type": "application/octet-stream",
            "headers": {UNREADABLE_HEADER: reason, UNREADABLE_CODE_HEADER: why.code},
            UNREADABLE_MARK: [why.code, reason, *_route(item, why)],
            "properties": {
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
                "delivery_info": {"exchange": "", "routing_key": queue},
                "delivery_mode": 2,
                "priority": 0,
            },
        }
    ).encode()
