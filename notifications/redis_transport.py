"""kombu's Redis transport, whose consumers never lose a message they cannot read.

kombu's Redis channel takes a message off its list (``BRPOP`` for a consumer, ``RPOP``
for a ``get``), parses its JSON envelope and builds its message before it records the
message as unacknowledged. An envelope that fails on the way (bytes that are not UTF-8
or not JSON, a ``{"__type__": ...}`` marker kombu's JSON reader refuses, a shape its
message cannot be built from) raises out of the consumer's receive with the message
already gone from Redis: the indexer stopped and the message was lost. And a body under
a ``compression`` header was decompressed whole, however large.

This channel reads the replies of those two commands first (a redis-py response
callback, so it runs inside the read kombu makes) and runs on each what kombu will run:
the parse, the message, the record of it as unacknowledged, with the decompression
bounded. An envelope that would fail is replaced by one kombu reads, whose body is the
original bytes and whose :data:`UNREADABLE_HEADER` says what failed; the indexer
dead-letters it ``malformed`` with that reason, acks it, and goes on. What it costs a
readable message is measured in the README (Performance). Producers are unchanged: only
what a consumer reads differs.

Connections get this transport from ``Bus.connection`` (:func:`kombu_url`); its alias is
registered with kombu when this module is imported.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps, loads

from cellsight.notifications.compression import bounded_decompress
from cellsight.notifications.errors import MalformedNotification, TooLarge, brief, clip
from cellsight.notifications.limits import MAX_BODY_BYTES

__all__ = [
    "ALIAS",
    "UNREADABLE_CODE_HEADER",
    "UNREADABLE_HEADER",
    "Channel",
    "Transport",
    "kombu_url",
    "readable",
]

ALIAS = "cellsight-redis"
UNREADABLE_HEADER = "x-cellsight-unreadable"
"""On a message the channel could not read: why, in one line. Its body is the bytes the
message came as (kombu's envelope, or whatever else was on the list)."""
UNREADABLE_CODE_HEADER = "x-cellsight-unreadable-code"
"""Its reason code: ``too_large`` for a body that decompresses past the bound (as on
RabbitMQ), ``malformed`` otherwise."""

# The schemes whose connections take this transport (kombu's Redis transport otherwise:
# ``rediss`` and ``sentinel`` keep kombu's, see the README's Limits).
_SCHEMES = {"redis": ALIAS, "redis+socket": f"{ALIAS}+socket"}


def kombu_url(url: str) -> str:
    """``url`` for a consuming connection: on this transport where it is a Redis one."""
    scheme, sep, rest = url.partition("://")
    ours = _SCHEMES.get(scheme.lower()) if sep else None
    return f"{ours}://{rest}" if ours else url


MAX_NESTING = 512


class UnreadableEnvelope(ValueError):
    """What kombu would fail on, named for the dead letter."""

    code = MalformedNotification.reason


class DecompressesTooLarge(UnreadableEnvelope):
    code = TooLarge.reason


def readable(channel: Any, item: bytes) -> None:
    """Raises :class:`UnreadableEnvelope` where kombu would fail on ``item`` between
    taking it off its list and recording it as unacknowledged (``_brpop_read``,
    ``basic_consume``'s callback, ``QoS.append``), or where its body decompresses past
    ``MAX_BODY_BYTES`` (or is no text, which the consumer cannot measure)."""
    try:
        text = item.decode("utf-8")  # kombu would replace bad bytes: the body would change
    except UnicodeDecodeError as exc:
        raise UnreadableEnvelope(
            f"the envelope is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        payload = loads(text)
        headers = payload.get("headers") if isinstance(payload, dict) else None
        codec = headers.get("compression") if isinstance(headers, dict) else None
        if codec and (body := payload.get("body")):
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
        message = channel.Message(payload, channel=channel)
        delivery = message.delivery_info
        delivery["exchange"], delivery["routing_key"]  # what ``QoS.append`` reads
        # What kombu's reader gives back its writer takes, but for nesting near the
        # interpreter's recursion limit, where one frame more or less decides (kombu
        # records it one level deeper, from another depth of the stack): refused here
        # well below it. Only an envelope with that many brackets is walked.
        if item.count(b"{") + item.count(b"[") > MAX_NESTING and _deeper(payload, MAX_NESTING):
            raise UnreadableEnvelope(f"the envelope is nested deeper than {MAX_NESTING} levels")
        if type(message.delivery_tag) is not str or not message.delivery_tag:
            raise UnreadableEnvelope(f"delivery tag {brief(message.delivery_tag, 60)}")
    except UnreadableEnvelope:
        raise
    except Exception as exc:  # kombu's parse and message raise whatever they meet
        raise UnreadableEnvelope(_why(exc)) from None
    if message.body and not isinstance(message.body, bytes | str):
        raise UnreadableEnvelope(f"its body is JSON {type(message.body).__name__}, not text")


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
    return f"{type(exc).__name__}: {clip(what, 200) if isinstance(what, str) else brief(what, 200)}"


def quarantined(item: bytes, queue: str, why: UnreadableEnvelope) -> bytes:
    """An envelope kombu reads, carrying ``item`` whole and why it was unreadable."""
    return dumps(
        {
            "body": base64.b64encode(item).decode("ascii"),
            "content-encoding": "binary",
            "content-type": "application/octet-stream",
            "headers": {
                UNREADABLE_HEADER: f"the bus could not read the message: {why}",
                UNREADABLE_CODE_HEADER: why.code,
            },
            "properties": {
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
                "delivery_info": {"exchange": "", "routing_key": queue},
                "delivery_mode": 2,
                "priority": 0,
            },
        }
    ).encode()


class Channel(kombu_redis.Channel):
    _getting = ""  # the queue of the ``RPOP`` under way: its reply does not name it

    def _create_client(self, asynchronous: bool = False) -> Any:
        client = super()._create_client(asynchronous)
        for command in ("BRPOP", "RPOP"):
            given = client.response_callbacks.get(command)
            client.set_response_callback(command, self._checking(command, given))
        return client

    def _get(self, queue: str, timeout: Any = None) -> Any:
        self._getting = queue
        try:
            return super()._get(queue)
        finally:
            self._getting = ""

    def _checking(self, command: str, given: Callable[..., Any] | None) -> Callable[..., Any]:
        def check(response: Any, **options: Any) -> Any:
            reply = given(response, **options) if given is not None else response
            if command == "RPOP":
                return self._checked(reply, self._getting) if isinstance(reply, bytes) else reply
            if reply and len(reply) == 2 and isinstance(reply[1], bytes):
                key = reply[0].decode(errors="replace") if isinstance(reply[0], bytes) else ""
                key = key.removeprefix(self.global_keyprefix or "")
                return (reply[0], self._checked(reply[1], key.rsplit(self.sep, 1)[0]))
            return reply

        return check

    def _checked(self, item: bytes, queue: str) -> bytes:
        """``item``, or in its place an envelope kombu reads that carries it; either way
        recorded as unacknowledged by kombu, and redelivered to ``queue`` if not acked."""
        try:
            readable(self, item)
        except UnreadableEnvelope as exc:
            return quarantined(item, queue, exc)
        return item


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
