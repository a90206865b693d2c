"""Dead letters are never lost: the DLQ must confirm before the original is acked, and a
replay removes a letter only once its republish reached a queue. On RabbitMQ and on the
embedded Redis bus, with the target unroutable and with the broker refusing."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Queue
from typer.testing import CliRunner

from cellsight.cli import app
from cellsight.cli.groups import register
from cellsight.clients import build_bus
from cellsight.indexer import consumer as consumer_module
from cellsight.indexer import deadletter
from cellsight.indexer.dlq import peek
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from cellsight.settings import Settings
from tests.support.indexing import (
    bus_settings,
    embedded_redis,
    frames_received,
    publish_bodies,
    running_indexer,
    wait_for,
)

register(app)

POISON = b"{this is not json"
BUSES = ["rabbitmq", "embedded"]


@pytest.fixture(params=BUSES)
def settings_on(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")
    return bus_settings(tmp_path / "data", request.param)


@contextmanager
def connected(settings: Settings) -> Iterator[Connection]:
    with build_bus(settings) as bus, bus.connection() as connection:
        yield connection


def publish_raw(settings: Settings, *bodies: bytes) -> None:
    publish_bodies(settings, bodies)


def count(settings: Settings, queue: Queue) -> int:
    with connected(settings) as conn:
        return int(queue(conn.channel()).queue_declare().message_count)


def dead_letters(settings: Settings) -> list[bytes]:
    with connected(settings) as conn:
        letters = peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 100)
        return [letter.body for letter in letters]


def indexer_queue(settings: Settings) -> Queue:
    return queues.indexer_queue(settings.indexer_queue, settings.exchange)


def delete_queue(settings: Settings, queue: Queue) -> None:
    with connected(settings) as conn:
        bound = queue(conn.channel())
        # kombu's Redis channel deletes only the bindings it declared itself.
        bound.declare()
        bound.delete()


def test_a_deleted_dlq_is_declared_again_and_no_dead_letter_is_lost(
    settings_on: Settings, embedded_index: EmbeddedEngine
) -> None:
    settings = settings_on
    publish_raw(settings, POISON)
    with running_indexer(settings, embedded_index) as consumer:
        wait_for(lambda: consumer.totals["dead"] >= 1, what="first dead letter")
        # Someone deletes the DLQ (and so its binding): the next dead-letter publish is
        # unroutable (a returned mandatory message / no binding on Redis). It must not be
        # acked as done; the handoff declares the DLQ again and retries.
        delete_queue(
            settings,
            queues.dead_letter_queue(settings.dead_letter_queue, settings.dead_letter_exchange),
        )
        publish_raw(settings, POISON + b" 2")
        wait_for(lambda: consumer.totals["dead"] >= 2, what="second dead letter")
        assert consumer.dead_letters.retries >= 1
    assert dead_letters(settings) == [POISON + b" 2"]  # the first went with the queue
    assert count(settings, indexer_queue(settings)) == 0


def refuse_dead_letters(settings: Settings, until: ExitStack) -> None:
    """The broker refuses every publish to the dead-letter queue until ``until`` closes."""
    if settings.bus_url:
        # A bound queue that is always full and rejects new publishes: RabbitMQ nacks.
        full = Queue(
            f"{settings.dead_letter_queue}-full",
            exchange=queues.dead_letter_exchange(settings.dead_letter_exchange),
            routing_key=queues.EVERYTHING,
            durable=False,
            queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )
        with connected(settings) as conn:
            full(conn.channel()).declare()
        until.callback(delete_queue, settings, full)
        return
    # Redis refuses the push onto the DLQ's list (WRONGTYPE) while its key holds a string.
    dlq, saved = settings.dead_letter_queue, f"{settings.dead_letter_queue}.saved"
    client = until.enter_context(embedded_redis(settings))
    client.rename(dlq, saved)
    client.set(dlq, "not a list")
    until.callback(client.rename, saved, dlq)
    until.callback(client.delete, dlq)


def test_a_refused_dead_letter_leaves_the_original_unacked_until_the_dlq_takes_it(
    settings_on: Settings, embedded_index: EmbeddedEngine
) -> None:
    settings = settings_on
    publish_raw(settings, POISON)
    with ExitStack() as refusal:
        with running_indexer(settings, embedded_index) as consumer:
            wait_for(lambda: consumer.totals["dead"] >= 1, what="first dead letter")
            refuse_dead_letters(settings, refusal)
            publish_raw(settings, POISON + b" 2")
            wait_for(lambda: consumer.dead_letters.retries >= 2, what="refused dead letters")
            assert consumer.totals["dead"] == 1  # the refused batch was not acked
        # Stopped while refused: the poison is back in the indexer queue, not lost.
        assert count(settings, indexer_queue(settings)) == 1
    with running_indexer(settings, embedded_index) as consumer:
        wait_for(lambda: consumer.totals["dead"] >= 1, what="dead letter after the refusal")
    # At least once: a queue that refused may sit beside one that kept a copy (a nack
    # means "not all queues took it"), so a retried dead letter can appear twice.
    assert set(dead_letters(settings)) == {POISON, POISON + b" 2"}
    assert count(settings, indexer_queue(settings)) == 0


def test_the_stream_keeps_its_heartbeats_while_a_refused_dead_letter_is_retried(
    tmp_path: Path,
    rabbitmq_url: str,
    embedded_index: EmbeddedEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bus-fault probe: while a dead letter was retried the consumer sent no
    heartbeats, so with ``?heartbeat=1`` the broker dropped its connection after about
    2 s and the batch, poison included, was redelivered and dead-lettered again."""
    caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
    plain = bus_settings(tmp_path / "data", "rabbitmq")
    settings = plain.model_copy(update={"bus_url": f"{plain.bus_url}?heartbeat=1"})
    with ExitStack() as refusal, running_indexer(settings, embedded_index) as consumer:
        refuse_dead_letters(settings, refusal)
        publish_raw(settings, POISON)
        # 0.2 + 0.4 + 0.8 + 1.6 + 3.2 s of backoff: past twice the heartbeat.
        wait_for(lambda: consumer.dead_letters.retries >= 6, 30, "refused dead letters")
        refusal.close()
        wait_for(lambda: consumer.acked >= 1, 30, "the poison acked once its letter was")
        assert consumer.totals["dead"] == 1
    lost = [r.getMessage() for r in caplog.records if "bus connection" in r.getMessage()]
    assert lost == []
    assert count(settings, indexer_queue(settings)) == 0


def test_the_stream_keeps_its_heartbeats_while_a_dead_letters_confirm_is_slow(
    tmp_path: Path,
    rabbitmq_url: str,
    embedded_index: EmbeddedEngine,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review: heartbeats sent only between the retries left the stream silent while
    a confirm was awaited (up to 10 s: a broker slow under an alarm). Here the first
    publish takes 4 s, past twice the heartbeat, before it goes."""
    caplog.set_level(logging.WARNING, logger=consumer_module.__name__)
    plain = bus_settings(tmp_path / "data", "rabbitmq")
    settings = plain.model_copy(update={"bus_url": f"{plain.bus_url}?heartbeat=1"})
    real = deadletter.publish_confirmed
    slowed: list[bool] = []

    def slow(*args: Any, **kwargs: Any) -> None:
        if not slowed:
            slowed.append(True)
            threading.Event().wait(4.0)  # the broker's own clock: nothing to wait on
        real(*args, **kwargs)

    monkeypatch.setattr(deadletter, "publish_confirmed", slow)
    with running_indexer(settings, embedded_index) as consumer:
        publish_raw(settings, POISON)
        wait_for(lambda: consumer.acked >= 1, 30, "the poison acked once its letter was")
        assert consumer.totals["dead"] == 1 and slowed
    lost = [r.getMessage() for r in caplog.records if "bus connection" in r.getMessage()]
    assert lost == []
    assert dead_letters(settings) == [POISON]


def test_one_heartbeat_thread_serves_a_batchs_dead_letters(
    tmp_path: Path,
    rabbitmq_url: str,
    embedded_index: EmbeddedEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reread: a thread was started for each dead letter, so a storm of poisons paid
    a thread's start and join per letter beside its publish and confirm."""
    plain = bus_settings(tmp_path / "data", "rabbitmq")
    settings = plain.model_copy(update={"bus_url": f"{plain.bus_url}?heartbeat=1"})
    real = consumer_module.heartbeats_meanwhile
    entered: list[str] = []

    @contextmanager
    def counted(connection: Connection) -> Iterator[None]:
        entered.append(threading.current_thread().name)
        with real(connection):
            yield

    monkeypatch.setattr(consumer_module, "heartbeats_meanwhile", counted)
    poisons = [POISON + b" " * i for i in range(5)]
    with running_indexer(settings, embedded_index) as consumer:
        publish_raw(settings, *poisons)
        wait_for(lambda: consumer.acked >= 5, 30, "the poisons dead-lettered")
        assert consumer.totals["dead"] == 5
    # Five letters, published at once: one batch (two if the age cut it).
    assert 1 <= len(entered) <= 2, entered
    assert sorted(dead_letters(settings)) == sorted(poisons)


def test_a_dead_letter_after_a_quiet_spell_goes_at_the_first_attempt(
    tmp_path: Path, rabbitmq_url: str, embedded_index: EmbeddedEngine
) -> None:
    """The dead-letter connection, idle between letters, sent no heartbeats: at
    ``?heartbeat=1`` the broker dropped it, and the next letter's first attempt failed
    ("dead letter not confirmed ... Connection reset by peer") before a retry took it."""
    plain = bus_settings(tmp_path / "data", "rabbitmq")
    settings = plain.model_copy(update={"bus_url": f"{plain.bus_url}?heartbeat=1"})
    with running_indexer(settings, embedded_index) as consumer:
        publish_raw(settings, POISON)
        wait_for(lambda: consumer.acked >= 1, 30, "the first poison dead-lettered")
        frames = frames_received(consumer)
        # Six of the broker's heartbeats (3 s), past the two intervals it waits for ours.
        wait_for(lambda: frames_received(consumer) >= frames + 6, 30, "idle")
        publish_raw(settings, POISON + b" 2")
        wait_for(lambda: consumer.acked >= 2, 30, "the second poison dead-lettered")
        assert consumer.dead_letters.retries == 0
    assert set(dead_letters(settings)) == {POISON, POISON + b" 2"}


def _cli(settings: Settings, *args: str) -> tuple[int, str]:
    env = {
        "CELLSIGHT_EXCHANGE": settings.exchange,
        "CELLSIGHT_INDEXER_QUEUE": settings.indexer_queue,
        "CELLSIGHT_DEAD_LETTER_EXCHANGE": settings.dead_letter_exchange,
        "CELLSIGHT_DEAD_LETTER_QUEUE": settings.dead_letter_queue,
    }
    if settings.bus_url:
        env["CELLSIGHT_BUS_URL"] = settings.bus_url
    result = CliRunner().invoke(app, ["--data-dir", str(settings.data_dir), *args], env=env)
    return result.exit_code, result.output


def test_replay_refuses_when_nothing_is_bound_and_keeps_the_letter(
    settings_on: Settings, embedded_index: EmbeddedEngine
) -> None:
    settings = settings_on
    publish_raw(settings, POISON)
    with running_indexer(settings, embedded_index) as consumer:
        wait_for(lambda: consumer.totals["dead"] >= 1, what="dead letter")
    assert dead_letters(settings) == [POISON]

    delete_queue(settings, indexer_queue(settings))  # nothing bound to the routing key now
    code, output = _cli(settings, "dlq", "replay")
    assert code == 1, output
    assert "error:" in output and "not replayed" in output and "Traceback" not in output
    assert dead_letters(settings) == [POISON]  # still there, once

    with connected(settings) as conn:
        indexer_queue(settings)(conn.channel()).declare()
    code, output = _cli(settings, "dlq", "replay")
    assert code == 0, output
    assert "replayed 1" in output
    assert dead_letters(settings) == []
    assert count(settings, indexer_queue(settings)) == 1  # moved, not copied or dropped
