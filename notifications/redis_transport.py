"""kombu's Redis transport, whose consumers lose no message: not one they cannot read,
not one they were taking when they were killed.

Cellsight's channel takes each message through a landing (``redis_landing``): from its
list onto a list of the consumer's own in one atomic command, and from there into
kombu's record of unacknowledged messages in one ``MULTI``, so that a consumer killed
between the two, or a server stopped between them, leaves the message where a live
consumer puts it back. And it reads each message before kombu does
(``redis_envelopes.readable``): one kombu would fail on, which used to stop the indexer
and be lost, is handed on in an envelope kombu reads, carrying the original bytes and
why (the indexer dead-letters it). Producers are unchanged: only what a consumer takes
and how differ.

Connections get this transport from ``Bus.connection`` (``unreadable.kombu_url``), by
the alias ``unreadable`` registers with kombu.
"""

from __future__ import annotations

import contextlib
import time
from functools import cached_property
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps, loads
from redis.exceptions import ResponseError

from cellsight.notifications.redis_envelopes import UnreadableEnvelope, quarantined, readable
from cellsight.notifications.redis_landing import TAKE, Landed, Landings
from cellsight.notifications.redis_refusals import RefusalAwareRedis, raise_refusal
from cellsight.notifications.unreadable import UNREADABLE_MARK

__all__ = ["Channel", "Message", "Transport"]


class QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        # Taken by any channel of the connection: kombu hands a message to the callback
        # of its queue, or to the connection's first channel, not always to the taker's.
        landed = self.channel._landed
        if landed is None or landed.tag != delivery_tag:
            return super().append(message, delivery_tag)
        info = message.delivery_info
        record = dumps([message._raw, info["exchange"], info["routing_key"]])
        # kombu's record (its append's two writes) and the landing's removal, in one MULTI.
        # The message is its landing's newest (a take pushes at the left, and the next
        # take waits for this record): trimming the landing's first element removes it
        # without sending it back (LPOP would reply with it).
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}).hset(
                self.unacked_key, delivery_tag, record
            ).ltrim(landed.landing, 1, -1).execute()
        self.channel._landed = None
        virtual.QoS.append(self, message, delivery_tag)
        return None

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        super().restore_visible(start, num, interval)
        if (self._vrestore_count - 1) % (interval or 1) == 0:  # when kombu's scan ran
            with self.channel.conn_or_acquire() as client:
                self.channel.landings.sweep(client)


class Message(virtual.Message):
    """kombu's message, and ``unreadable``: ``(code, reason)`` when the channel could not
    read what it came as (:func:`quarantined`), from its envelope's ``UNREADABLE_MARK``,
    which a producer's headers cannot set."""

    def __init__(self, payload: dict[str, Any], channel: Any = None, **kwargs: Any) -> None:
        super().__init__(payload, channel=channel, **kwargs)
        mark = payload.get(UNREADABLE_MARK)
        self.unreadable: tuple[str, str] | None = None
        # The (exchange, routing key) it was published with, as far as it was known.
        self.original_route: tuple[str, str] | None = None
        if isinstance(mark, list) and len(mark) in (2, 4):
            self.unreadable = (str(mark[0]), str(mark[1]))
            route = mark[2:] or ["", ""]  # marked before routes were kept: unknown
            self.original_route = (str(route[0]), str(route[1]))


class Channel(kombu_redis.Channel):
    """kombu's channel, taking messages through a landing (``redis_landing``) and
    reading each before kombu does (:func:`readable`)."""

    QoS = QoS
    Message = Message
    # A wait on one list of several: the others are polled between waits, so this is
    # how late a message on one of them can be when the consumer was idle.
    SHARED_WAIT = 0.25
    _taking: tuple[str, list[str]] | None = None  # the take under way: its kind, sources
    _found_none = False  # the last poll of every list found them all empty
    _had: str | None = None  # the list the last take took from, if it was the first tried
    _next_idle = 0.0  # when an empty take next restores what dead consumers left

    @property
    def _landed(self) -> Landed | None:
        """Taken, not yet recorded by ``QoS.append``: one at a time on a connection."""
        landed: Landed | None = getattr(self.connection, "landed", None)
        return landed

    @_landed.setter
    def _landed(self, landed: Landed | None) -> None:
        self.connection.landed = landed

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._no_ack: dict[str, bool] = {}  # queue -> consumed without acks
        self._sources_of: dict[tuple[str, ...], list[str]] = {}
        super().__init__(*args, **kwargs)

    def _get_client(self) -> Any:
        # Cellsight sets no ``global_keyprefix`` (``bus.redis_transport_options``), for
        # which kombu's own client prefixes keys.
        return RefusalAwareRedis if not self.global_keyprefix else super()._get_client()

    @cached_property
    def landings(self) -> Landings:
        return Landings(self.global_keyprefix or "", self.visibility_timeout)

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        self._no_ack[queue] = bool(kwargs.get("no_ack", args[0] if args else False))
        return super().basic_consume(queue, *args, **kwargs)

    def _sources(self, queues: list[str]) -> list[str]:
        """The lists of ``queues`` in kombu's order (priorities, then queues), prefixed:
        built once for each order the queue cycle gives."""
        key = tuple(queues)
        sources = self._sources_of.get(key)
        if sources is None:
            prefix = self.global_keyprefix or ""
            steps = self.priority_steps
            sources = [f"{prefix}{self._q_for_pri(q, pri)}" for pri in steps for q in queues]
            if len(self._sources_of) >= 256:
                self._sources_of.clear()
            self._sources_of[key] = sources
        return sources

    def _hold(self, sources: list[str], *, get: bool = False) -> None:
        if self.landings.due(sources, get):
            with self.conn_or_acquire() as client:
                # Leftovers go back only with no take under way (a get may come between).
                self.landings.hold(client, sources, get=get, reclaim=not self._in_poll)

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        sources = self._sources(queues)
        if self._taking is not None:  # a take whose reply was never read (kombu dropped
            self._taking = None  # the connection under it): its message may be landed
            self.landings.unsettled()
        self._hold(sources)
        # One list can be waited on (BRPOPLPUSH), several only polled (a script cannot
        # block): a poll of all of them, then, if it found none, a short wait on the first.
        # While the first (kombu's first choice too) keeps giving, it is taken from
        # directly (RPOPLPUSH: no script, and no wait that would hold up the others).
        wait = min(timeout or self.brpop_timeout or Landings.MAX_WAIT, Landings.MAX_WAIT)
        landing = self.landings.landing(sources[0])
        command: list[Any]
        if len(sources) == 1 or self._found_none:
            kind = "BRPOPLPUSH"
            wait = wait if len(sources) == 1 else min(wait, self.SHARED_WAIT)
            command = [kind, sources[0], landing, wait]
        elif self._had == sources[0]:
            kind = "RPOPLPUSH"
            command = [kind, sources[0], landing]
        else:
            kind = "EVAL"
            command = [kind, TAKE, 2 * len(sources), *self.landings.take_args(sources)]
        self._taking = (kind, sources)
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()  # type: ignore[assignment]  # kombu's: None
        self.client.connection.send_command(*command)

    def _read_take(self, **options: Any) -> tuple[str, bytes] | None:
        """The reply of the take under way: the list it came from and the message."""
        kind, sources = self._taking or ("BRPOPLPUSH", [])
        try:
            try:
                reply = self.client.parse_response(self.client.connection, kind, **options)
            except ResponseError as exc:  # read here, not through ``execute_command``
                raise_refusal(self.pool, exc)
                raise
        except self.connection_errors:
            self.landings.unsettled()  # the server may have landed it
            self.client.connection.disconnect()  # as kombu: the next cycle reconnects
            raise
        finally:
            self._taking = None
        if kind == "EVAL":
            self._found_none = not reply
            self._had = sources[0] if reply and int(reply[0]) == 1 else None
            return (sources[int(reply[0]) - 1], reply[1]) if reply else None
        self._found_none = False
        self._had = sources[0] if isinstance(reply, bytes) else None
        return (sources[0], reply) if isinstance(reply, bytes) else None

    def _land(self, source: str, item: bytes, queue: str, *, get: bool = False) -> Any:
        """The payload of a message taken onto its landing, which ``QoS.append`` is to
        take it off when it records it (or ``_settle``, if it does not)."""
        landed = self._landed = Landed(self.landings.landing(source, get), source, item)
        payload = loads(self._checked(item, queue))
        landed.tag = payload["properties"]["delivery_tag"]
        return payload

    def _brpop_read(self, **options: Any) -> bool:
        try:
            taken = self._read_take(**options)
            if taken is None:
                self._idle()
                raise Empty()
            source, item = taken
            queue = source.removeprefix(self.global_keyprefix or "").rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            payload = self._land(source, item, queue)
            if self._no_ack.get(queue) and self._landed is not None:
                self._settle(self._landed, delivered=True)  # at most once, as kombu does
            self.connection._deliver(payload, queue)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu's: a bool
            self._after_take()
            # One message is landed at a time on a connection: none was at this take's
            # start, so one landed now is this take's, unrecorded: back to its list.
            if self._landed is not None:
                self._settle(self._landed, delivered=False)

    def _idle(self) -> None:
        """A take found nothing: the moment to restore what dead consumers left (kombu
        restores only when its poll times out, which a wait shorter than the poll's
        timeout never lets happen): at most once a second, under kombu's throttle."""
        now = monotonic()
        if now < self._next_idle:
            return
        self._next_idle = now + 1.0
        with contextlib.suppress(*self.connection_errors):
            self.qos.restore_visible(
                num=self.unacked_restore_limit, interval=self.unacked_restore_throttle
            )

    def _poll_error(self, type: str, **options: Any) -> None:
        if type == "BRPOP" and self._taking is not None:
            with contextlib.suppress(Exception):  # kombu's: the reply read and dropped
                self._read_take(**options)
            self.landings.unsettled()
            return
        super()._poll_error(type, **options)

    def _after_take(self) -> None:
        # Where kombu has it: a re-authentication token waits for the connection to idle.
        if (flush := getattr(self, "_flush_brpop_reauth", None)) is not None:
            flush()

    def _get(self, queue: str, timeout: Any = None) -> Any:
        sources = self._sources([queue])
        self._hold(sources, get=True)
        with self.conn_or_acquire() as client:
            args = self.landings.take_args(sources, get=True)
            reply = client.eval(TAKE, 2 * len(sources), *args)
            if (expire := getattr(self, "_maybe_update_queues_expire", None)) is not None:
                expire(client, queue)  # where kombu has it: queues that expire unused
        if not reply or not isinstance(reply[1], bytes):
            raise Empty()
        return self._land(sources[int(reply[0]) - 1], reply[1], queue, get=True)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        got = False
        try:
            message = super().basic_get(queue, no_ack, **kwargs)
            got = True
            return message
        finally:
            if self._landed is not None:  # unrecorded: delivered (no_ack), or back
                self._settle(self._landed, delivered=got and no_ack)

    def _settle(self, landed: Landed, *, delivered: bool) -> None:
        """A taken message that ``QoS.append`` did not record: taken off its landing if
        it is delivered without a record (``no_ack``), else put back at the head of its
        list. If that fails, the next take's ``hold`` puts it back."""
        self._landed = None
        try:
            with self.conn_or_acquire() as client:
                if delivered:
                    client.ltrim(landed.landing, 1, -1)  # its newest, as in ``QoS.append``
                else:
                    self.landings.put_back(client, landed)
        except self.connection_errors:
            self.landings.unsettled()

    def close(self) -> None:
        if not self.closed:
            if self._in_poll:  # as kombu's close: the take under way is delivered first
                self._closing = True
                with contextlib.suppress(Empty):
                    self._brpop_read()
            if "landings" in self.__dict__:
                try:
                    with self.conn_or_acquire() as client:
                        self.landings.release(client)
                except self.connection_errors:
                    pass  # the lease runs out and another consumer's sweep puts them back
            if self._qos is not None:
                # kombu restores what is unacked after it has disconnected the channel's
                # pools, on connections it opens then and never closes: the embedded
                # server, counting them, was never the last one's to stop (``dlq list``
                # left it running). Restored here, while the pools are open; kombu's own
                # call then finds nothing left to do.
                try:
                    self._qos.restore_unacked_once()
                except self.connection_errors:
                    # Not restored (the server is gone): kombu's own call tries again. Left
                    # marked restored with messages in it, that call failed its assert and
                    # the indexer died of an AssertionError when its bus was killed.
                    self._qos._delivered.restored = False
        super().close()

    def _checked(self, item: bytes, queue: str) -> bytes:
        """``item``, or in its place an envelope kombu reads that carries it; either way
        recorded as unacknowledged by kombu, and redelivered to ``queue`` if not acked."""
        try:
            readable(self, item, queue)
        except UnreadableEnvelope as exc:
            return quarantined(item, queue, exc)
        return item


class Transport(kombu_redis.Transport):
    Channel = Channel
