"""The indexer's reconnect backoff grows through one outage and starts afresh at the
next: an indexer that came through a few outages in its life must not wait the longest
backoff at every later blip of the bus."""

from __future__ import annotations

import logging
import re
import socket
import time
import uuid
from pathlib import Path

import pytest
from kombu import Connection
from kombu.exceptions import ChannelError

from cellsight.indexer import consumer as consumer_module
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.settings import Settings
from tests.indexer.test_consumer_pipeline import GatedEngine
from tests.indexer.test_poison_bus import publish
from tests.support import novagen
from tests.support.indexing import bus_settings, frames_received, running_indexer, wait_for
from tests.support.proxy import Proxy

pytestmark = pytest.mark.services

WAIT = re.compile(r"reconnecting in ([\d.]+)s")


def _waits(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [float(m.group(1)) for r in caplog.records if (m := WAIT.search(r.getMessage()))]


def _consumers(url: str, queue: str) -> int:
    """The queue's consumers, 0 while it does not exist."""
    with Connection(url) as connection:
        try:
            return int(connection.default_channel.queue_declare(queue, passive=True).consumer_count)
        except ChannelError:
            return 0


def _through_a_proxy(tmp_path: Path) -> tuple[Settings, Proxy, Settings, EmbeddedEngine]:
    """Settings on RabbitMQ directly, a proxy to it (started), the same settings through
    the proxy, and an embedded engine ready for instances."""
    direct = bus_settings(tmp_path / "data", "rabbitmq")
    proxy = Proxy(("127.0.0.1", 5672))
    proxy.start()
    settings = direct.model_copy(update={"bus_url": f"amqp://guest:guest@127.0.0.1:{proxy.port}//"})
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    return direct, proxy, settings, engine


def test_the_backoff_starts_afresh_once_the_bus_was_back(
    tmp_path: Path,
    rabbitmq_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Consuming this long, a connection's loss starts a new outage (raising=False: the
    # code before this fix had no such setting, and failed the test's last assertion).
    monkeypatch.setattr(consumer_module, "STEADY", 1.0, raising=False)
    caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
    direct, proxy, settings, engine = _through_a_proxy(tmp_path)

    def indexed(n: int) -> str:
        uuid_ = str(uuid.uuid4())
        publish(direct, [novagen.body(novagen.notification(seed=n, uuid_=uuid_))])
        return uuid_

    try:
        with running_indexer(settings, engine):
            first = indexed(1)
            wait_for(lambda: engine.get("instance", first) is not None, 30, "first indexed")
            proxy.stop()  # a long outage: the backoff grows
            wait_for(lambda: len(_waits(caplog)) >= 3, 30, "three failed reconnects")
            proxy.start()
            second = indexed(2)
            wait_for(lambda: engine.get("instance", second) is not None, 60, "consuming again")
            grown = _waits(caplog)
            assert grown == sorted(grown) and grown[-1] >= 2.0, grown
            caplog.clear()
            time.sleep(1.5)  # consuming for longer than STEADY: that outage is over
            proxy.stop()
            proxy.start()
            wait_for(lambda: bool(_waits(caplog)), 30, "the blip noticed")
            assert _waits(caplog)[0] == 0.5, _waits(caplog)
            third = indexed(3)
            wait_for(lambda: engine.get("instance", third) is not None, 30, "consuming again")
    finally:
        proxy.stop()
        engine.close()


def test_a_bus_refused_from_the_start_is_unreachable_not_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's wrong port: the indexer retries, and says it never reached the bus."""
    caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = bus_settings(tmp_path / "data", "rabbitmq").model_copy(
        update={"bus_url": f"amqp://guest:guest@127.0.0.1:{port}//"}
    )
    engine = EmbeddedEngine(tmp_path / "index.db")
    try:
        with running_indexer(settings, engine):
            wait_for(lambda: bool(_waits(caplog)), 30, "a failed connect")
        lines = [r.getMessage() for r in caplog.records if WAIT.search(r.getMessage())]
        assert lines[0].startswith("bus unreachable ("), lines
        assert not any("lost" in line for line in lines), lines
    finally:
        engine.close()


def test_a_bus_path_that_carries_nothing_is_let_go_and_the_indexer_stops_at_once(
    tmp_path: Path, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bus-fault probe: a path to the broker kept open that stops carrying bytes (a
    frozen proxy or load balancer) hung the indexer once its heartbeats were missed:
    the channels' closing handshakes waited for the broker without end, and SIGTERM
    went unheard. It is let go of, said in one line, and the indexer stops when told."""
    caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
    direct = bus_settings(tmp_path / "data", "rabbitmq")
    proxy = Proxy(("127.0.0.1", 5672))
    proxy.start()
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//?heartbeat=1"
    settings = direct.model_copy(update={"bus_url": url})
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    first = str(uuid.uuid4())
    publish(direct, [novagen.body(novagen.notification(seed=1, uuid_=first))])
    try:
        with running_indexer(settings, engine):  # stopped on exit, within 30 s or fails
            wait_for(lambda: engine.get("instance", first) is not None, 30, "first indexed")
            proxy.freeze()
            try:
                wait_for(lambda: bool(_waits(caplog)), 30, "the silent path let go of")
            finally:
                proxy.thaw()  # so that a test of the hang fails rather than hangs too
            assert any("bus connection lost" in r.getMessage() for r in caplog.records)
    finally:
        proxy.stop()
        engine.close()


def test_an_idle_indexer_with_frequent_heartbeats_stops_when_told(
    tmp_path: Path, rabbitmq_url: str
) -> None:
    """At ``?heartbeat=1`` the broker's heartbeats came every 0.5 s, within the wait's
    1 s timeout, and py-amqp's wait for a delivery started again at each: an idle
    indexer never got back to its stop flag (found as a test of the dead-letter retry's
    heartbeats hung on its way out)."""
    plain = bus_settings(tmp_path / "data", "rabbitmq")
    settings = plain.model_copy(update={"bus_url": f"{plain.bus_url}?heartbeat=1"})
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    first = str(uuid.uuid4())
    publish(plain, [novagen.body(novagen.notification(seed=1, uuid_=first))])
    try:
        with running_indexer(settings, engine) as consumer:  # fails unless stopped in 30 s
            wait_for(lambda: engine.get("instance", first) is not None, 30, "first indexed")
            collector = consumer._collector
            assert collector is not None
            idle, real_idle = [], collector.idle

            def counted() -> int | None:
                idle.append(1)
                return real_idle()

            collector.idle = counted  # type: ignore[method-assign]
            frames = frames_received(consumer)
            # Three of the broker's heartbeats, and nothing else, since: idle in the wait.
            wait_for(lambda: frames_received(consumer) >= frames + 3, 30, "heartbeats")
            # And its idle collection ran (a review: never, once heartbeats ended the wait).
            wait_for(lambda: len(idle) >= 2, 30, "idle passes")
    finally:
        engine.close()


def test_a_deleted_queue_is_said_as_such_and_declared_again(
    tmp_path: Path, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker cancels the consumer of a deleted queue: the indexer logged it as
    "bus connection lost (Basic.cancel: (0) None1)" (a bus-fault probe)."""
    caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    url = settings.bus_url
    assert url is not None
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    publish(settings, [novagen.body(novagen.notification(seed=1, uuid_=first))])
    try:
        with running_indexer(settings, engine):
            wait_for(lambda: engine.get("instance", first) is not None, 30, "first indexed")
            with Connection(url) as connection:
                connection.default_channel.queue_delete(settings.indexer_queue)
            wait_for(lambda: bool(_waits(caplog)), 30, "the cancel")
            wait_for(lambda: _consumers(url, settings.indexer_queue) == 1, 30, "back")
            publish(settings, [novagen.body(novagen.notification(seed=2, uuid_=second))])
            wait_for(lambda: engine.get("instance", second) is not None, 30, "second indexed")
        said = [r.getMessage() for r in caplog.records if WAIT.search(r.getMessage())]
        queue = settings.indexer_queue
        assert said == [f"the broker cancelled the consumer ({queue}); reconnecting in 0.5s"]
    finally:
        engine.close()


def test_a_connection_lost_while_stopping_announces_no_reconnect(
    tmp_path: Path, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe: SIGTERM while a write was held, the bus lost during the shutdown's grace,
    logged "bus connection lost (…); reconnecting in 0.5s" and then no reconnect came."""
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    direct, proxy, settings, engine = _through_a_proxy(tmp_path)
    held = str(uuid.uuid4())
    gated = GatedEngine(engine, held_id=held)
    publish(direct, [novagen.body(novagen.notification(seed=1, uuid_=held))])
    try:
        with running_indexer(settings, gated) as consumer:  # type: ignore[arg-type]
            wait_for(gated.first_started.is_set, 30, "the write, held")
            consumer.stop.set()
            proxy.stop()  # lost while the consumer waits out its shutdown grace
    finally:
        gated.release.set()
        proxy.stop()
        # The abandoned write goes on once released: the engine is closed after it.
        wait_for(lambda: gated.finished >= 1, 30, "the held write done")
        engine.close()
    said = [r.getMessage() for r in caplog.records]
    assert not _waits(caplog), said
    assert any("bus connection lost while stopping" in line for line in said), said
    assert consumer.acked == 0  # the held message stays the broker's, for redelivery
