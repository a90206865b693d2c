"""The bound on the bytes of messages a worker holds: at ``held_bytes`` it stops
consuming and hands back what the broker had already sent; at half of it it consumes
again; nothing is lost either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.intake import Intake
from cellsight.settings import Settings
from tests.indexer.test_consumer_pipeline import GatedEngine
from tests.support import novagen
from tests.support.indexing import publish_bodies, running_indexer, wait_for


class Body:
    def __init__(self, size: int) -> None:
        self.body = b"x" * size


class Subscription:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def cancel(self) -> None:
        self.calls.append("cancel")

    def consume(self) -> None:
        self.calls.append("consume")


def test_intake_pauses_at_the_limit_and_resumes_at_half() -> None:
    intake, subscription = Intake(limit=1000), Subscription()
    kept = [Body(400) for _ in range(3)]
    assert [intake.admit(b) for b in kept] == [True, True, True]  # type: ignore[arg-type]
    assert not intake.admit(Body(1))  # type: ignore[arg-type]  # 1,200 held: at the limit
    intake.steer(subscription)
    assert subscription.calls == ["cancel"] and intake.paused
    intake.settled(kept[:1])  # type: ignore[arg-type]
    intake.steer(subscription)  # 800 held: above half
    assert subscription.calls == ["cancel"]
    assert not intake.admit(Body(1))  # type: ignore[arg-type]  # paused: handed back
    intake.settled(kept[1:2])  # type: ignore[arg-type]
    intake.steer(subscription)  # 400 held
    assert subscription.calls == ["cancel", "consume"] and not intake.paused
    assert intake.handed_back == 2 and intake.held == 400


def test_one_message_past_the_limit_is_kept_when_nothing_is_held() -> None:
    intake = Intake(limit=100)
    assert intake.admit(Body(5000))  # type: ignore[arg-type]
    assert not intake.admit(Body(1))  # type: ignore[arg-type]
    intake.reset()
    assert intake.held == 0 and intake.admit(Body(1))  # type: ignore[arg-type]


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
        gated.release.set()
        wait_for(lambda: consumer.acked >= len(uuids), what="everything written and acked")
        assert not intake.paused and intake.held == 0
    assert consumer.totals == {"indexed": 60, "stale": 0, "ignored": 0, "dead": 0}
    assert all(engine.get("instance", u) is not None for u in uuids)
    engine.close()
