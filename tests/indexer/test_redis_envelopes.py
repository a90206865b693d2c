"""The embedded Redis bus loses no message it cannot read, and the indexer does not stop
at one (``notifications.redis_transport``).

What goes onto the indexer's list is written with a plain Redis client, as anything on
the machine with the socket could: kombu envelopes broken every way kombu's reader
fails, bytes that are no envelope, a decompression bomb, and random bytes. Each is
dead-lettered with the bytes it came as and a reason, every good notification around
them is indexed, and kombu's record of unacknowledged messages is empty at the end.
On the code before this transport the first of them raised out of the indexer's
receive, with the message already off the list.
"""

from __future__ import annotations

import bz2
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection

from cellsight.clients import build_bus
from cellsight.indexer.dlq import DeadLetter, get_as_stored, peek
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from cellsight.notifications.limits import MAX_BODY_BYTES
from cellsight.notifications.redis_transport import (
    UNREADABLE_HEADER,
    UnreadableEnvelope,
    kombu_url,
    readable,
)
from cellsight.settings import Settings
from tests.support import novagen, poison
from tests.support.indexing import (
    bus_settings,
    embedded_redis,
    publish_bodies,
    running_indexer,
    wait_for,
)
from tests.support.services import kill_embedded_redis_servers

KEY = "versioned_notifications.info"


def an_envelope(settings: Settings) -> dict[str, Any]:
    """A real kombu envelope of a good notification, taken off the list as it was put."""
    publish_bodies(settings, [novagen.body(poison.good(seed=99))])
    with embedded_redis(settings) as client:
        item = client.rpop(settings.indexer_queue)
    assert isinstance(item, bytes)
    envelope: dict[str, Any] = json.loads(item)
    return envelope


def broken(envelope: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> bytes:
    copy = json.loads(json.dumps(envelope))
    change(copy)
    return json.dumps(copy).encode()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *parents, last = path.split(".")

    def change(envelope: dict[str, Any]) -> None:
        target = envelope
        for name in parents:
            target = target[name]
        target[last] = value

    return change


def bad_items(envelope: dict[str, Any]) -> dict[str, bytes]:
    deep_headers = b'{"headers": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}"
    return {
        "not utf-8": b'{"body": "\xff\xfe"}',
        "not json": b"{this is not json",
        "json, not an object": b'"a string"',
        "a bare notification": novagen.body(poison.good(seed=5)),
        "an unknown type marker": broken(
            envelope, _set("headers", {"x": {"__type__": "nope", "__value__": 1}})
        ),
        "a marker kombu cannot read": broken(
            envelope, _set("headers", {"x": {"__type__": "datetime", "__value__": "garbage"}})
        ),
        "no properties": broken(envelope, lambda e: e.pop("properties")),
        "no delivery info": broken(envelope, lambda e: e["properties"].pop("delivery_info")),
        "headers a list": broken(envelope, _set("headers", ["compression"])),
        "bad base64": broken(envelope, _set("body", "!!! not base64 !!!")),
        "a JSON number for body": broken(
            envelope, lambda e: (e.update(body=5), e["properties"].pop("body_encoding"))
        ),
        "a list for delivery tag": broken(envelope, _set("properties.delivery_tag", [1])),
        "headers nested 100,000 deep": deep_headers,
        # Read, and deep enough that kombu's record of it could pass the recursion limit.
        "headers nested 600 deep": broken(envelope, _set("headers", {"x": nested(600)})),
    }


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def settings_(tmp_path: Path) -> Settings:
    return bus_settings(tmp_path / "data", "embedded")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    yield engine
    engine.close()


def letters(settings: Settings) -> list[DeadLetter]:
    with build_bus(settings) as bus, bus.connection() as conn:
        return list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 1000))


def unacked(settings: Settings) -> int:
    with embedded_redis(settings) as client:
        return int(client.hlen("unacked"))


@pytest.mark.parametrize("pipeline", ["threads", "process"])
def test_unreadable_envelopes_are_dead_lettered_and_the_indexer_goes_on(
    settings_: Settings, engine: EmbeddedEngine, pipeline: str
) -> None:
    envelope = an_envelope(settings_)
    bad = bad_items(envelope)
    goods = [poison.good(seed=100 + i) for i in range(len(bad) + 1)]
    with embedded_redis(settings_) as client:
        for good, item in zip(goods, [*bad.values(), None], strict=True):
            publish_bodies(settings_, [novagen.body(good)])
            if item is not None:
                client.lpush(settings_.indexer_queue, item)
    with running_indexer(settings_, engine, pipeline) as consumer:
        wait_for(lambda: consumer.acked >= len(goods) + len(bad), 60, "every message acked")
    assert consumer.totals["indexed"] == len(goods)
    assert consumer.totals["dead"] == len(bad)
    for good in goods:
        assert engine.get("instance", poison.data(good)["uuid"]) is not None
    found = letters(settings_)
    # Each is in the dead-letter queue as the bytes it came as, with what failed.
    assert sorted(letter.body for letter in found) == sorted(bad.values())
    assert {letter.reason_code for letter in found} == {"malformed"}
    for letter in found:
        assert letter.reason is not None
        assert letter.reason.startswith("the bus could not read the message: "), letter.reason
    by_body = {letter.body: letter.reason for letter in found}
    assert "not UTF-8" in str(by_body[bad["not utf-8"]])
    assert "RecursionError" in str(by_body[bad["headers nested 100,000 deep"]])
    assert "delivery tag" in str(by_body[bad["a list for delivery tag"]])
    assert "deeper than 512 levels" in str(by_body[bad["headers nested 600 deep"]])
    assert unacked(settings_) == 0


def test_a_decompression_bomb_is_too_large_on_the_embedded_bus(
    settings_: Settings, engine: EmbeddedEngine
) -> None:
    """kombu decompressed a body whole; here it is refused past the bound, as on
    RabbitMQ (``too_large``), and a compressed notification within it is indexed."""
    good = poison.good(seed=3)
    publish_bodies(settings_, [novagen.body(good)], compression="bzip2")
    bomb = bz2.compress(b"0" * (MAX_BODY_BYTES + 1))
    headers = {"compression": "application/x-bz2"}
    publish_bodies(settings_, [bomb], headers=headers)
    with running_indexer(settings_, engine) as consumer:
        wait_for(lambda: consumer.acked >= 2, 60, "both messages acked")
    assert (consumer.totals["indexed"], consumer.totals["dead"]) == (1, 1)
    assert engine.get("instance", poison.data(good)["uuid"]) is not None
    [letter] = letters(settings_)
    assert letter.reason_code == "too_large"
    assert f"past {MAX_BODY_BYTES} bytes" in str(letter.reason)
    # The letter's body is the envelope the bomb came in, the compressed bytes inside.
    assert json.loads(letter.body)["headers"]["compression"] == "application/x-bz2"


def test_an_unreadable_letter_does_not_stop_the_dead_letter_readers(settings_: Settings) -> None:
    """``dlq peek`` gets with ``RPOP``: a letter that is no envelope is read as its bytes."""
    with build_bus(settings_) as bus, bus.connection() as conn:
        dlx = queues.dead_letter_exchange(settings_.dead_letter_exchange)
        queues.dead_letter_queue(settings_.dead_letter_queue, dlx)(conn.channel()).declare()
    with embedded_redis(settings_) as client:
        client.lpush(settings_.dead_letter_queue, b"\x00 not an envelope")
    [letter] = letters(settings_)
    assert letter.body == b"\x00 not an envelope"
    with build_bus(settings_) as bus, bus.connection() as conn, conn.channel() as channel:
        dlx = queues.dead_letter_exchange(settings_.dead_letter_exchange)
        stored = get_as_stored(queues.dead_letter_queue(settings_.dead_letter_queue, dlx)(channel))
    assert stored is not None
    assert "JSONDecodeError" in stored.headers[UNREADABLE_HEADER]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(items=st.lists(st.binary(max_size=300), min_size=1, max_size=8))
def test_any_bytes_on_the_list_are_indexed_or_dead_lettered(
    tmp_path_factory: pytest.TempPathFactory, items: list[bytes]
) -> None:
    """Whatever bytes are on the list, the indexer takes each, indexes or dead-letters
    it, and is still running for the good notification after them."""
    root = tmp_path_factory.mktemp("bytes")
    settings_ = bus_settings(root / "data", "embedded")
    engine = EmbeddedEngine(root / "index.db")
    engine.ensure_ready("instance")
    try:
        good = poison.good(seed=1)
        publish_bodies(settings_, [])  # declares the queue
        with embedded_redis(settings_) as client:
            for item in items:
                client.lpush(settings_.indexer_queue, item)
        publish_bodies(settings_, [novagen.body(good)])
        with running_indexer(settings_, engine) as consumer:
            wait_for(lambda: consumer.acked >= len(items) + 1, 60, "every message acked")
        assert consumer.totals["dead"] == len(items)
        assert engine.get("instance", poison.data(good)["uuid"]) is not None
        assert sorted(letter.body for letter in letters(settings_)) == sorted(items)
        assert unacked(settings_) == 0
    finally:
        engine.close()
        kill_embedded_redis_servers(root)


ENVELOPE_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
PLACES = ["body", "headers", "headers.compression", "properties", "properties.delivery_tag",
          "properties.body_encoding", "properties.delivery_info",
          "properties.delivery_info.routing_key", "content-type"]  # fmt: skip
AGREE = "cellsight-agree"


@pytest.fixture(scope="module")
def embedded_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of an embedded bus that stays up while the module's tests use it."""
    root = tmp_path_factory.mktemp("agree")
    with build_bus(bus_settings(root / "data", "embedded")) as bus:
        yield bus.url
    kill_embedded_redis_servers(root)


def kombu_takes(bus_url: str, item: bytes) -> bool:
    """Whether kombu's own Redis transport takes ``item`` off the list into a consumer's
    callback (and its record of unacknowledged messages) without raising."""
    got: list[Any] = []
    with Connection(bus_url) as conn, conn.channel() as channel:
        channel.client.lpush(AGREE, item)
        channel.basic_consume(AGREE, no_ack=False, callback=got.append, consumer_tag="agree")
        try:
            conn.drain_events(timeout=2)
        except Exception:
            return False
        finally:
            channel.client.delete(AGREE)
        [message] = got
        message.ack()
    return True


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(place=st.sampled_from(PLACES), value=ENVELOPE_VALUES)
def test_readable_refuses_what_kombu_cannot_take(embedded_bus: str, place: str, value: Any) -> None:
    """``readable`` refuses an envelope where kombu's own consumer fails on it (measured
    on a real Redis server, with kombu's transport), and besides only where the indexer
    could not use what kombu makes of it: a body that is no text, a delivery tag that
    is no string."""
    envelope = {
        "body": "eyJhIjogMX0=",
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {},
        "properties": {
            "body_encoding": "base64",
            "delivery_info": {"exchange": "nova", "routing_key": KEY},
            "delivery_mode": 2,
            "delivery_tag": "5f0c8d6e-9f39-4c8e-8c3b-2f3f0b9b7d11",
            "priority": 0,
        },
    }
    try:
        _set(place, value)(envelope)
    except (TypeError, KeyError):
        return
    item = json.dumps(envelope).encode()
    with Connection(kombu_url(embedded_bus)) as conn:
        try:
            readable(conn.default_channel, item)
            refused = False
        except UnreadableEnvelope:
            refused = True
    takes = kombu_takes(embedded_bus, item)
    properties = envelope.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    body, tag = envelope.get("body"), properties.get("delivery_tag")
    unusable = (
        (properties.get("body_encoding") is None and bool(body) and not isinstance(body, str))
        or type(tag) is not str or not tag
    )  # fmt: skip
    assert refused == (not takes or unusable), (takes, unusable)


def test_kombu_url_takes_only_redis_schemes() -> None:
    assert kombu_url("redis+socket:///data/bus.sock") == "cellsight-redis+socket:///data/bus.sock"
    assert kombu_url("REDIS://h:6379/0") == "cellsight-redis://h:6379/0"
    for url in ("amqp://guest@h//", "rediss://h:6380/0", "sentinel://h:26379", "memory://"):
        assert kombu_url(url) == url
