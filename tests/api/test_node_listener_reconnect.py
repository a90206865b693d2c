"""The API's node listener comes back after its bus connection is lost, on RabbitMQ (a
proxy cut and restored) and on the embedded Redis bus (its connection killed by the
server): it stopped for good at the first loss, and the cache then expired by TTL only
(an adversarial probe). What was published meanwhile was not heard, so the cache is
dropped when the bus is lost and again when the listener is back."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest
import redis
from kombu import Connection, Exchange

from cellsight.api.node_listener import start_listener
from cellsight.api.query2.node_cache import CellLoad
from cellsight.cells.nodeevents import register_node, set_node_state
from cellsight.cells.operations import Operations
from cellsight.clients import build_bus, build_notifier
from cellsight.settings import Settings
from tests.api.test_node_listener import Watched, listening
from tests.support.indexing import bus_settings
from tests.support.proxy import Proxy
from tests.support.waiting import wait_for


def _heard_again(cache: Watched, registry: object, direct: Settings) -> None:
    """A node event published after the listener is back reaches the cache."""
    with build_notifier(direct) as notifier:
        ops = Operations(registry, notifier, publisher_id="elsewhere")  # type: ignore[arg-type]
        cache.heard.clear()
        set_node_state(ops, "cell1", "h1", offline=True)
        assert cache.heard.wait(30), "the listener never came back"
    assert [d["offline"] for d in cache.get().documents] == [True]


def _registered(cache: Watched, registry: object, direct: Settings) -> int:
    with build_notifier(direct) as notifier:
        register_node(
            Operations(registry, notifier, publisher_id="elsewhere"),  # type: ignore[arg-type]
            "cell1",
            "h1",
        )
    assert cache.heard.wait(30)
    assert [d["offline"] for d in cache.get().documents] == [False]
    return cache.invalidations


@pytest.mark.services
def test_rabbitmq_lost_and_back(
    tmp_path: Path, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellsight.api.node_listener")
    direct = bus_settings(tmp_path / "data", "rabbitmq")
    proxy = Proxy(("127.0.0.1", 5672))
    proxy.start()
    via_proxy = direct.model_copy(
        update={"bus_url": f"amqp://guest:guest@127.0.0.1:{proxy.port}//"}
    )
    try:
        with listening(via_proxy, tmp_path) as (registry, cache):
            before = _registered(cache, registry, direct)
            proxy.stop()  # open connections closed, new ones refused
            wait_for(lambda: "listener is off the bus" in caplog.text, 30, "the loss noticed")
            assert cache.invalidations > before  # dropped while nothing is heard
            loads = cache.loads
            assert [d["offline"] for d in cache.get().documents] == [False]
            assert cache.loads == loads + 1  # read from the cells, not the dropped entries
            dropped = cache.invalidations
            proxy.start()
            wait_for(lambda: "back on the bus" in caplog.text, 60, "the listener back")
            assert cache.invalidations > dropped
            _heard_again(cache, registry, direct)
    finally:
        proxy.stop()


def test_embedded_connection_killed_and_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellsight.api.node_listener")
    settings = bus_settings(tmp_path / "data", "embedded")
    with listening(settings, tmp_path) as (registry, cache):
        before = _registered(cache, registry, settings)
        # The test's own client stays connected until the listener is back: the embedded
        # server stops when its last client leaves.
        with build_bus(settings) as bus:
            assert bus.server is not None
            client = redis.Redis(unix_socket_path=str(bus.server.socket))
            killed = client.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 1
            wait_for(lambda: "back on the bus" in caplog.text, 60, "the listener back")
            client.close()
        assert cache.invalidations > before
        _heard_again(cache, registry, settings)


@pytest.mark.services
def test_a_queue_the_broker_will_not_bind_is_tried_again(
    tmp_path: Path, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel error at bind (here 406: the exchange exists with another type) went to
    kombu's own loop, retried every second, without dropping the cache or backing off.
    The listener says so, drops the cache once, backs off, and binds once it can."""
    caplog.set_level(logging.WARNING, logger="cellsight.api.node_listener")
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    with Connection(rabbitmq_url) as conn:
        wrong = Exchange(settings.exchange, "fanout", channel=conn.channel())
        wrong.declare()
    cache = Watched(lambda: [], lambda cells: CellLoad({}))
    ready, stop = start_listener(settings, cache)
    try:
        lost = "listener is off the bus"
        wait_for(lambda: caplog.text.count(lost) >= 2, 30, "two failed binds")
        assert not ready.is_set() and cache.invalidations == 1
        with Connection(rabbitmq_url) as conn:
            wrong.bind(conn.channel()).delete()
        assert ready.wait(30), "the listener never bound its queue"
    finally:
        stop.set()


def test_a_stop_while_the_bus_is_down_ends_the_listener_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopped between kombu's connect tries (2 s, then 4 s, ... 30 s apart), the
    listener ended only at the next failed try; kombu's per-second callback ends it."""
    caplog.set_level(logging.WARNING, logger="cellsight.api.node_listener")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nothing listens on
    url = f"amqp://guest:guest@127.0.0.1:{closed.getsockname()[1]}//"
    settings = bus_settings(tmp_path / "data", "embedded").model_copy(update={"bus_url": url})
    before = set(threading.enumerate())
    ready, stop = start_listener(settings, Watched(lambda: [], lambda cells: CellLoad({})))
    (thread,) = [t for t in threading.enumerate() if t not in before]
    try:
        wait_for(lambda: "trying again in 2s" in caplog.text, 30, "a failed connect")
        stop.set()
        thread.join(1.5)  # the callback runs every second of kombu's sleep
        assert not thread.is_alive() and not ready.is_set()
    finally:
        stop.set()
        closed.close()
