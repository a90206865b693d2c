"""The poison corpus and fuzzed notifications, end to end through the consumer on the
real buses (RabbitMQ and the embedded Redis bus), interleaved with good messages: each
poison is in the dead-letter queue with its reason, each good one is indexed, the
indexer keeps running."""

from __future__ import annotations

import contextlib
import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Producer

from cellsight.clients import build_bus
from cellsight.indexer.dlq import DeadLetter, get_as_stored, peek
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import plan
from cellsight.notifications import queues
from cellsight.settings import Settings
from tests.indexer.test_decode_fuzz import KNOWN_CODES, VALUES, WHERE, mutate
from tests.support import novagen, poison
from tests.support.indexing import PIPELINES, bus_settings, running_indexer, wait_for
from tests.support.services import kill_embedded_redis_servers

BUSES = ["rabbitmq", "embedded"]


def _settings(bus: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    if bus == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")
    return bus_settings(tmp_path / "data", bus)


def publish(settings: Settings, bodies: list[bytes]) -> None:
    with build_bus(settings) as b, b.connection() as conn:
        producer = Producer(conn.channel())
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        for raw in bodies:
            producer.publish(
                raw,
                exchange=exchange,
                routing_key="versioned_notifications.info",
                content_type="application/json",
                content_encoding="binary",
                delivery_mode=2,
            )


def dead_letters(settings: Settings) -> list[DeadLetter]:
    with build_bus(settings) as b, b.connection() as conn:
        return list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 1000))


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("bus", BUSES)
def test_poison_corpus_through_the_consumer(
    bus: str, pipeline: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    settings = _settings(bus, tmp_path, request)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    corpus = poison.corpus()
    accepted = poison.accepted()
    bodies: list[bytes] = []
    good_uuids: list[str] = []
    for i, (body, _) in enumerate(corpus.values()):
        good = poison.good(seed=5000 + i)
        good_uuids.append(poison.data(good)["uuid"])
        bodies += [novagen.body(good), body]
    bodies += [body for body, _ in accepted.values()]
    publish(settings, bodies)

    with running_indexer(settings, engine, pipeline) as consumer:
        wait_for(lambda: sum(consumer.totals.values()) >= len(bodies), 120, "every message")
        # Still consuming after all of it: one more good message is indexed.
        last = poison.good(seed=99_999)
        publish(settings, [novagen.body(last)])
        wait_for(
            lambda: engine.get("instance", poison.data(last)["uuid"]) is not None,
            30,
            "a message after the poison",
        )
    assert consumer.totals["dead"] == len(corpus)
    assert consumer.totals["indexed"] == len(good_uuids) + len(accepted) + 1
    for uuid in good_uuids + [u for _, u in accepted.values()]:
        assert engine.get("instance", uuid) is not None, uuid
    nul = engine.get("instance", accepted["nul_in_string"][1])
    assert nul is not None and nul.document["display_name"] == "nul\x00inside"

    by_body = {letter.body: letter for letter in dead_letters(settings)}
    assert len(by_body) == len(corpus)
    for kind, (body, code) in corpus.items():
        letter = by_body[body]  # the original bytes, unchanged
        assert letter.reason_code == code, (kind, letter.reason)
        assert letter.reason, kind
    engine.close()


@pytest.mark.parametrize("bus", BUSES)
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mutations=st.lists(
        st.lists(st.tuples(WHERE, VALUES, st.booleans()), min_size=1, max_size=2),
        min_size=12,
        max_size=12,
    ),
    wrapped=st.booleans(),
)
def test_fuzzed_notifications_through_the_consumer(
    bus: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    mutations: list[list[Any]],
    wrapped: bool,
) -> None:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    settings = _settings(bus, tmp_path, request)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    bodies: list[bytes] = []
    for i, changes in enumerate(mutations):
        body = copy.deepcopy(novagen.notification(seed=7000 + i))
        for where, value, drop in changes:
            with contextlib.suppress(KeyError, TypeError, IndexError):
                mutate(body, where, value, drop)
        bodies.append(json.dumps(novagen.oslo(body) if wrapped else body).encode())
        bodies.append(novagen.body(poison.good(seed=8000 + i)))
    expected, planned = plan(bodies)
    # A multiset: two mutated bodies can come out byte-identical (a payload replaced by
    # the same value, and the generated envelopes differ only in publisher_id).
    expect_dead = Counter(
        (bodies[i], o.reason_code)
        for i, o in enumerate(expected)
        if o is not None and o.verdict is Verdict.DEAD
    )
    assert all(code in KNOWN_CODES for _, code in expect_dead)
    publish(settings, bodies)
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: sum(consumer.totals.values()) >= len(bodies), 60, "every message")
    assert consumer.totals["dead"] == expect_dead.total()
    letters = Counter((letter.body, letter.reason_code) for letter in dead_letters(settings))
    assert letters == expect_dead
    for p in planned:
        assert engine.get(p.op.resource, p.op.id) is not None, p.op.id
    engine.close()
    kill_embedded_redis_servers(tmp_path)  # per example: no test's tmp_path covers it


@pytest.mark.parametrize("bus", BUSES)
def test_compressed_and_latin_1_bodies_through_the_bus(
    bus: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What a producer may set on the wire, through the indexer on each bus: a body
    compressed by kombu (oslo.messaging's ``kombu_compression``) is indexed; poison
    bodies (labelled latin-1; compressed; under a ``compression`` header that lies; under
    one naming an unknown codec) are dead-lettered with the bytes they came with, the
    compressed one's copy still agrees with its header (on the Redis bus kombu hands the
    consumer the body decompressed), and ``dlq peek`` reads all four."""
    settings = _settings(bus, tmp_path, request)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    good = poison.good(seed=4242)
    latin_1 = b'{"caf\xe9": ['
    squeezed = b'{"compressed": [' + b"x" * 200
    bogus, unknown = b"not zlib at all", b"unknown codec"
    with build_bus(settings) as b, b.connection() as conn:
        producer = Producer(conn.channel())
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        key = "versioned_notifications.info"
        producer.publish(novagen.body(good), exchange=exchange, routing_key=key, compression="gzip")
        producer.publish(
            latin_1,
            exchange=exchange,
            routing_key=key,
            content_type="application/json",
            content_encoding="latin-1",
        )
        producer.publish(
            squeezed,
            exchange=exchange,
            routing_key=key,
            content_type="application/json",
            content_encoding="utf-8",
            compression="zlib",
        )
        for body, codec in ((bogus, "application/x-gzip"), (unknown, "application/x-nope")):
            producer.publish(
                body,
                exchange=exchange,
                routing_key=key,
                content_type="application/json",
                content_encoding="utf-8",
                headers={"compression": codec},
            )
    with running_indexer(settings, engine, "process") as consumer:
        # On the Redis bus kombu raised that one's error out of the receive: the indexer
        # stopped at it (and would again at its redelivery).
        wait_for(lambda: sum(consumer.totals.values()) >= 5, 60, "all five messages")
    assert consumer.totals["indexed"] == 1 and consumer.totals["dead"] == 4
    assert engine.get("instance", poison.data(good)["uuid"]) is not None
    # ``dlq peek`` reads each as it came, those with a wrong header included (kombu's
    # ``Queue.get`` raised their decompression error: one such letter stopped the readers).
    assert [letter.body for letter in dead_letters(settings)] == [latin_1, squeezed, bogus, unknown]
    with build_bus(settings) as b, b.connection() as conn, conn.channel() as channel:
        dlx = queues.dead_letter_exchange(settings.dead_letter_exchange)
        dlq = queues.dead_letter_queue(settings.dead_letter_queue, dlx)(channel)
        copies = [c for _ in range(4) if (c := get_as_stored(dlq)) is not None]
        assert len(copies) == 4
        # Each copy's body agrees with its ``compression`` header, except the two whose
        # header was wrong on the way in: kombu decompresses the others without an error.
        seen = sorted((c.headers.get("compression") or "-", bool(c.errors)) for c in copies)
        assert seen == [
            ("-", False),
            ("application/x-gzip", False),
            ("application/x-gzip", True),
            ("application/x-nope", True),
        ]
    engine.close()
