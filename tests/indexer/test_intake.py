"""The bound on the bytes of messages a worker holds: at ``held_bytes`` it stops
consuming and hands back what the broker had already sent; at half of it it consumes
again; nothing is lost either way."""

from __future__ import annotations

import itertools
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from cellsight.indexer.amqp_deliveries import Received
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.intake import Intake, size
from cellsight.settings import Settings
from tests.indexer.test_consumer_pipeline import GatedEngine
from tests.support import novagen
from tests.support.indexing import bus_settings, publish_bodies, running_indexer, wait_for
from tests.support.proxy import Proxy


class Body:
    def __init__(self, size: int) -> None:
        self.body: bytes | str = b"x" * size
        self.wire_body: bytes | None = None


def message(size: int) -> Received:
    """A received message of ``size`` bytes, as the intake reads one."""
    return cast(Received, Body(size))


class Subscription:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def cancel(self) -> None:
        self.calls.append("cancel")

    def consume(self) -> None:
        self.calls.append("consume")

    def qos(self, prefetch_size: int = 0, prefetch_count: int = 0) -> None:
        self.calls.append(f"qos {prefetch_count}")


def test_intake_pauses_at_the_limit_and_resumes_at_half_with_what_fits() -> None:
    intake, subscription = Intake(limit=1000, prefetch=50), Subscription()
    kept = [message(400) for _ in range(3)]
    assert [intake.admit(b) for b in kept] == [True, True, True]
    assert not intake.admit(message(400))  # 1,200 held: at the limit
    intake.steer(subscription)
    assert subscription.calls == ["cancel"] and intake.paused
    intake.settled(kept[:1])
    intake.steer(subscription)  # 800 held: above half
    assert subscription.calls == ["cancel"]
    assert not intake.admit(message(400))  # paused: handed back
    intake.settled(kept[1:2])
    intake.steer(subscription)  # 400 held: 600 left, one message of about 400 fits
    assert subscription.calls == ["cancel", "qos 1", "consume"] and not intake.paused
    assert intake.handed_back == 2 and intake.held == 400


def test_the_grant_grows_back_as_the_messages_get_smaller() -> None:
    intake, subscription = Intake(limit=100_000, prefetch=50), Subscription()
    for _ in range(3):
        assert intake.admit(message(40_000))
    intake.steer(subscription)
    intake.settled([message(40_000)] * 3)
    intake.steer(subscription)
    assert subscription.calls == ["cancel", "qos 2", "consume"]
    for _ in range(40):  # small messages again: the running mean comes down
        assert intake.admit(message(100))
        intake.settled([message(100)])
        intake.steer(subscription)
    grants = [int(c.split()[1]) for c in subscription.calls if c.startswith("qos")]
    # Each new grant twice the last or more, or the whole prefetch; each its own consumer.
    assert all(b >= min(50, 2 * a) for a, b in itertools.pairwise(grants)) and grants[-1] == 50
    assert subscription.calls[3:].count("cancel") == len(grants) - 1
    assert intake.granted == 50


def test_one_message_past_the_limit_is_kept_when_nothing_is_held() -> None:
    intake = Intake(limit=100, prefetch=10)
    assert intake.admit(message(5000))
    assert not intake.admit(message(1))
    intake.reset()
    assert intake.held == 0 and intake.admit(message(1))


def test_a_body_read_otherwise_than_it_came_counts_both() -> None:
    """A body decoded from UTF-32 is text: counted by its size in memory along with the
    bytes it came as (counted by characters, a probe's workers held five times the bound)."""
    text = "é" * 1000
    decoded = Body(0)
    decoded.body, decoded.wire_body = text, text.encode("utf-32")
    assert size(cast(Received, decoded)) == sys.getsizeof(text) + 4004
    plain = Body(3000)
    plain.wire_body = plain.body  # type: ignore[assignment]  # UTF-8: one object
    assert size(cast(Received, plain)) == 3000


@pytest.fixture
def settings(each_bus: Settings) -> Settings:
    return each_bus


def test_a_frozen_engine_holds_no_more_than_the_bound_and_loses_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    notifications = [novagen.notification("instance.update", seed=i) for i in range(60)]
    bodies = [novagen.body(n) for n in notifications]
    uuids = [n["payload"]["nova_object.data"]["uuid"] for n in notifications]
    biggest = max(map(len, bodies))
    limit = 8 * biggest
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    gated = GatedEngine(engine, held_id=uuids[0])
    publish_bodies(settings, bodies)
    overrides: dict[str, Any] = {"batch_count": 2, "batch_age": 0.02, "held_bytes": limit}
    with running_indexer(settings, gated, **overrides) as consumer:  # type: ignore[arg-type]
        intake = consumer._intake
        wait_for(gated.first_started.is_set, what="the first write, held")
        wait_for(lambda: intake.paused, what="consuming paused at the bound")
        # The broker's deliveries come in batches of what it had sent before the cancel:
        # every one of them past the bound went back, none is held.
        assert intake.held <= limit + biggest
        assert consumer.received <= limit // min(map(len, bodies)) + 1
        assert consumer.received < len(bodies)
        first = intake.handed_back
        gated.release.set()
        wait_for(lambda: consumer.acked >= len(uuids), what="everything written and acked")
        # Each resume asked for what fits, not the whole prefetch: the broker did not
        # send the backlog again to be handed back (it did: 120 more on RabbitMQ). A
        # message or two above the running mean may still not fit.
        assert intake.handed_back - first <= 2
        assert not intake.paused and intake.held == 0
    assert consumer.totals == {"indexed": 60, "stale": 0, "ignored": 0, "dead": 0}
    assert all(engine.get("instance", u) is not None for u in uuids)
    engine.close()


def test_a_bus_gone_silent_during_a_pause_does_not_hold_the_worker(
    tmp_path: Path, rabbitmq_url: str
) -> None:
    """A review: py-amqp waits for the answers to cancel, qos and consume with no
    timeout, so a connection that went silent while paused held the worker for good,
    its heartbeats unchecked and its stop unseen. Here the proxy holds every byte from
    the pause on; the worker finds the connection dead by its heartbeats and stops."""
    direct = bus_settings(tmp_path / "data", "rabbitmq")
    proxy = Proxy(("127.0.0.1", 5672))
    proxy.start()
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//?heartbeat=2"
    settings = direct.model_copy(update={"bus_url": url})
    notifications = [novagen.notification("instance.update", seed=i) for i in range(30)]
    bodies = [novagen.body(n) for n in notifications]
    held = notifications[0]["payload"]["nova_object.data"]["uuid"]
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    gated = GatedEngine(engine, held_id=held)
    publish_bodies(direct, bodies)
    overrides: dict[str, Any] = {
        "batch_count": 2, "batch_age": 0.02, "held_bytes": 4 * max(map(len, bodies))
    }  # fmt: skip
    indexing = running_indexer(settings, cast(SearchEngine, gated), **overrides)
    safety_net = threading.Timer(60, proxy.thaw)
    try:
        with indexing as consumer:
            wait_for(lambda: consumer._intake.paused, what="consuming paused at the bound")
            proxy.freeze()
            # Thawed later only so that a regression fails (the worker not stopped within
            # the 30 s the block waits) instead of hanging the suite.
            safety_net.start()
            gated.release.set()  # the held batches settle: the intake resumes, unanswered
            wait_for(lambda: not consumer._intake.paused, what="resumed")
            # Leaving the block stops the worker and waits 30 s for it.
    finally:
        safety_net.cancel()
        gated.release.set()
        proxy.thaw()
        proxy.stop()
        wait_for(lambda: gated.finished >= 1, what="the held write done")  # then close
        engine.close()
