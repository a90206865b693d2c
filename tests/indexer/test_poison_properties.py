"""Message properties a foreign client may write, through the indexer on RabbitMQ (the
broker passes them on unchecked): the indexer must neither stop nor lose a message.

Found by an adversarial probe: a property py-amqp cannot parse (a short string that is
not UTF-8) stopped the indexer when it dead-lettered the message, and again at every
redelivery; a header of about 128 KiB made the dead letter's copy pass RabbitMQ's frame
size, the broker closed the connection, and the publish's error handling then raised an
``AttributeError`` of its own (the producer had lost its connection; that part is
tested in ``tests/notifications``)."""

from __future__ import annotations

import bz2
from pathlib import Path
from typing import Any

import pytest
from amqp import serialization
from kombu import Producer

from cellsight.clients import build_bus
from cellsight.indexer.deadletter import HEADERS_DROPPED, REASON_CODE_HEADER
from cellsight.indexer.dlq import get_as_stored, peek, replay
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from cellsight.settings import Settings
from tests.support import novagen, poison
from tests.support.indexing import PIPELINES, bus_settings, running_indexer, wait_for

POISON = b'{"not": "a notification"}'
NOT_UTF_8 = b"\xff\xfe"


def publish(settings: Settings, messages: list[tuple[bytes, dict[str, Any]]]) -> None:
    with build_bus(settings) as b, b.connection() as conn:
        producer = Producer(conn.channel())
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        for body, properties in messages:
            defaults = {
                "routing_key": "versioned_notifications.info",
                "content_type": "application/json",
                "content_encoding": "utf-8",
            }
            producer.publish(body, exchange=exchange, **(defaults | properties))


def dead_letter_headers(settings: Settings, count: int) -> list[dict[str, Any]]:
    with build_bus(settings) as b, b.connection() as conn, conn.channel() as channel:
        dlx = queues.dead_letter_exchange(settings.dead_letter_exchange)
        dlq = queues.dead_letter_queue(settings.dead_letter_queue, dlx)(channel)
        letters = [m for _ in range(count) if (m := get_as_stored(dlq)) is not None]
        return [dict(m.headers or {}, body=m.body) for m in letters]


class Raw(bytes):
    """A header value written as given (its type octet, then its payload), as another
    client library may write it where py-amqp would choose another type."""


@pytest.fixture
def raw_values(monkeypatch: pytest.MonkeyPatch) -> None:
    original = serialization._write_item

    def write_item(value: Any, write: Any, bits: Any) -> Any:
        if isinstance(value, Raw):
            return write(bytes(value))
        return original(value, write, bits)

    monkeypatch.setattr(serialization, "_write_item", write_item)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_unreadable_and_oversized_properties(
    pipeline: str, rabbitmq_url: str, tmp_path: Path, raw_values: None
) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    goods = [poison.good(seed=7100 + i) for i in range(3)]
    publish(
        settings,
        [
            (POISON, {"message_id": NOT_UTF_8}),
            # A header whose name holds "compression" makes the receive read the headers.
            (novagen.body(goods[0]), {"message_id": NOT_UTF_8, "headers": {"x-compression": 1}}),
            (POISON + b" ", {"headers": {"pad": "x" * 130_700}}),
            # One-byte integers py-amqp writes back in five: 60 KB in, 150 KB copied.
            (POISON + b"  ", {"headers": {"pad": [Raw(b"b\x01")] * 30_000}}),
            # The broker routes a key's bytes; py-amqp reads it as strict UTF-8.
            (POISON + b"   ", {"routing_key": b"versioned_notifications.\xff"}),
            (novagen.body(goods[1]), {"correlation_id": NOT_UTF_8}),
            (novagen.body(goods[2]), {}),
        ],
    )
    with running_indexer(settings, engine, pipeline) as consumer:
        wait_for(lambda: sum(consumer.totals.values()) >= 7, 60, "all seven messages")
    assert consumer.totals["indexed"] == 3 and consumer.totals["dead"] == 4
    for good in goods:
        assert engine.get("instance", poison.data(good)["uuid"]) is not None
    letters = dead_letter_headers(settings, 4)
    assert [letter["body"] for letter in letters] == [POISON + b" " * i for i in range(4)]
    assert [letter[REASON_CODE_HEADER] for letter in letters] == ["invalid_envelope"] * 4
    dropped = [letter.get(HEADERS_DROPPED, "") for letter in letters]
    assert dropped[0].startswith("unreadable: UnicodeDecodeError")
    assert dropped[1].endswith("bytes as copied, over 65536") and "pad" not in letters[1]
    assert dropped[2].endswith("bytes as copied, over 65536") and "pad" not in letters[2]
    assert dropped[3] == ""
    assert letters[3]["x-original-routing-key"] == "versioned_notifications.\ufffd"
    engine.close()


def test_dead_letters_are_read_and_replayed_byte_for_byte(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    """Bodies whose content encoding does not survive a decode and an encode back (py-amqp
    decoded them on ``basic.get``): ``dlq list`` and ``dlq replay`` once handed on a BOM
    added or turned, or an escape undone, and replay then acked the original away."""
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    odd = [
        (b'\xef\xbb\xbf{"poison": 1', "utf-8-sig"),
        (b'\xfe\xff\x00{\x00"', "utf-16"),
        (b'{"poison": "a\\"b\\u00e9"}', "unicode_escape"),
    ]
    publish(settings, [(body, {"content_encoding": encoding}) for body, encoding in odd])
    queue = queues.indexer_queue(
        settings.indexer_queue, queues.notifications_exchange(settings.exchange)
    )
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] == 3, 60, "three dead letters")
    bodies = [body for body, _ in odd]
    with build_bus(settings) as b, b.connection() as conn:
        letters = peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 10)
        assert [letter.body for letter in letters] == bodies
        replayed, *_ = replay(
            conn,
            exchange_name=settings.exchange,
            dlx_name=settings.dead_letter_exchange,
            dlq_name=settings.dead_letter_queue,
        )
        assert replayed == 3
        with conn.channel() as channel:
            bound = queue(channel)
            again = [m.body for _ in odd if (m := get_as_stored(bound)) is not None]
    assert again == bodies
    engine.close()


def test_a_compression_bomb_is_dead_lettered_and_listed_as_stored(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    """64 MiB of zeros in a few KB of bz2: dead-lettered as too large, and ``dlq list``
    shows the stored bytes; kombu's own reading (``Queue.get``) would hold it whole."""
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    bomb = bz2.compress(bytes(64 << 20))
    publish(settings, [(bomb, {"headers": {"compression": "application/x-bz2"}})])
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] == 1, 60, "the bomb dead-lettered")
    (letter,) = dead_letter_headers(settings, 1)
    assert letter[REASON_CODE_HEADER] == "too_large"
    assert letter["body"] == bomb and letter["compression"] == "application/x-bz2"
    with build_bus(settings) as b, b.connection() as conn:
        (listed,) = peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 10)
    assert listed.body == bomb
    engine.close()
