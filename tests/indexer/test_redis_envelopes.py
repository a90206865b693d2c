"""The embedded Redis bus loses no message it cannot read, and the indexer does not stop
at one (``notifications.redis_transport``).

What goes onto the indexer's list is written with a plain Redis client, as anything on
the machine with the socket could: kombu envelopes broken every way kombu's reader
fails, bytes that are no envelope, a decompression bomb, and random bytes. Each is
dead-lettered with the bytes it came as and a reason, every good notification around
them is indexed, and kombu's record of unacknowledged messages is empty at the end.
On the code before this transport the first of them raised out of the indexer's
receive, with the message already off the list.

How ``dlq`` reads, keeps and replays such letters: ``test_redis_envelope_letters``;
``readable`` held to kombu's own transport: ``test_redis_envelope_readable``.
"""

from __future__ import annotations

import bz2
import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Consumer

from cellsight.clients import build_bus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from cellsight.notifications.limits import MAX_BODY_BYTES
from cellsight.notifications.unreadable import UNREADABLE_CODE_HEADER, UNREADABLE_HEADER
from cellsight.settings import Settings
from tests.support import novagen, poison
from tests.support.indexing import (
    bus_settings,
    embedded_redis,
    publish_bodies,
    running_indexer,
    wait_for,
)
from tests.support.redis_envelopes import (
    KEY,
    an_envelope,
    broken,
    letters,
    set_field,
)
from tests.support.services import embedded_redis_servers, kill_embedded_redis_servers


def bad_items(envelope: dict[str, Any]) -> dict[str, bytes]:
    deep_headers = b'{"headers": ' + b'{"a": ' * 2_000 + b"1" + b"}" * 2_000 + b"}"
    return {
        "not utf-8": b'{"body": "\xff\xfe"}',
        "not json": b"{this is not json",
        "json, not an object": b'"a string"',
        "a bare notification": novagen.body(poison.good(seed=5)),
        "an unknown type marker": broken(
            envelope, set_field("headers", {"x": {"__type__": "nope", "__value__": 1}})
        ),
        "a marker kombu cannot read": broken(
            envelope, set_field("headers", {"x": {"__type__": "datetime", "__value__": "garbage"}})
        ),
        "no properties": broken(envelope, lambda e: e.pop("properties")),
        "no delivery info": broken(envelope, lambda e: e["properties"].pop("delivery_info")),
        "headers a list": broken(envelope, set_field("headers", ["compression"])),
        "bad base64": broken(envelope, set_field("body", "!!! not base64 !!!")),
        "a JSON number for body": broken(
            envelope, lambda e: (e.update(body=5), e["properties"].pop("body_encoding"))
        ),
        "a list for delivery tag": broken(envelope, set_field("properties.delivery_tag", [1])),
        "headers nested 2,000 deep": deep_headers,
        "70,000 lists in its headers": broken(envelope, set_field("headers", {"x": [[]] * 70_000})),
        # Read, and deep enough that kombu's record of it could pass the recursion limit.
        "headers nested 600 deep": broken(envelope, set_field("headers", {"x": nested(600)})),
        # Taken by kombu, then fatal to the indexer's dead letter or lost when restored.
        "a tag that is a lone surrogate": broken(
            envelope, set_field("properties.delivery_tag", "\ud800")
        ),
        "a null body": broken(envelope, set_field("body", None)),
        "an empty list for body": broken(envelope, set_field("body", [])),
        "a surrogate body, no encoding": broken(
            envelope, lambda e: (e.update(body="\ud800"), e["properties"].pop("body_encoding"))
        ),
        "a number for content encoding": broken(envelope, set_field("content-encoding", 5)),
        "null headers": broken(envelope, set_field("headers", None)),
        "an infinite priority": broken(envelope, set_field("properties.priority", float("inf"))),
        "no exchange, no routing key": broken(
            envelope, set_field("properties.delivery_info", {"exchange": "", "routing_key": ""})
        ),
        "a marker whose error quotes a surrogate": broken(
            envelope, set_field("headers", {"x": {"__type__": "uuid", "__value__": {"\ud800": 1}}})
        ),
    }


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def unacked(settings: Settings) -> int:
    with embedded_redis(settings) as client:
        return int(client.hlen("unacked"))


@pytest.mark.parametrize("pipeline", ["threads", "process"])
def test_unreadable_envelopes_are_dead_lettered_and_the_indexer_goes_on(
    settings_: Settings, embedded_index: EmbeddedEngine, pipeline: str
) -> None:
    envelope = an_envelope(settings_)
    bad = bad_items(envelope)
    goods = [poison.good(seed=100 + i) for i in range(len(bad) + 1)]
    with embedded_redis(settings_) as client:
        for good, item in zip(goods, [*bad.values(), None], strict=True):
            publish_bodies(settings_, [novagen.body(good)])
            if item is not None:
                client.lpush(settings_.indexer_queue, item)
    with running_indexer(settings_, embedded_index, pipeline) as consumer:
        wait_for(lambda: consumer.acked >= len(goods) + len(bad), 60, "every message acked")
    assert consumer.totals["indexed"] == len(goods)
    assert consumer.totals["dead"] == len(bad)
    for good in goods:
        assert embedded_index.get("instance", poison.data(good)["uuid"]) is not None
    found = letters(settings_)
    # Each is in the dead-letter queue as the bytes it came as, with what failed; but for
    # the one kombu reads, with an error (its body is text no encoding holds), whose
    # letter carries that body.
    expected = {**bad, "a surrogate body, no encoding": "\ud800".encode("utf-8", "surrogatepass")}
    assert sorted(letter.body for letter in found) == sorted(expected.values())
    assert {letter.reason_code for letter in found} == {"malformed"}
    for letter in (
        letter for letter in found if letter.body != expected["a surrogate body, no encoding"]
    ):
        assert letter.reason is not None
        assert letter.reason.startswith("the bus could not read the message: "), letter.reason
        letter.reason.encode("utf-8")  # prints: a surrogate it quotes is escaped
    by_body = {letter.body: letter.reason for letter in found}
    assert "not UTF-8" in str(by_body[bad["not utf-8"]])
    assert "RecursionError" in str(by_body[bad["headers nested 2,000 deep"]])
    assert "brackets, over 65536" in str(by_body[bad["70,000 lists in its headers"]])
    assert "delivery tag" in str(by_body[bad["a list for delivery tag"]])
    assert "deeper than 512 levels" in str(by_body[bad["headers nested 600 deep"]])
    assert unacked(settings_) == 0


def test_a_decompression_bomb_is_too_large_on_the_embedded_bus(
    settings_: Settings, embedded_index: EmbeddedEngine
) -> None:
    """kombu decompressed a body whole; here it is refused past the bound, as on
    RabbitMQ (``too_large``), and a compressed notification within it is indexed."""
    good = poison.good(seed=3)
    publish_bodies(settings_, [novagen.body(good)], compression="bzip2")
    bomb = bz2.compress(b"0" * (MAX_BODY_BYTES + 1))
    headers = {"compression": "application/x-bz2"}
    publish_bodies(settings_, [bomb], headers=headers)
    with running_indexer(settings_, embedded_index) as consumer:
        wait_for(lambda: consumer.acked >= 2, 60, "both messages acked")
    assert (consumer.totals["indexed"], consumer.totals["dead"]) == (1, 1)
    assert embedded_index.get("instance", poison.data(good)["uuid"]) is not None
    [letter] = letters(settings_)
    assert letter.reason_code == "too_large"
    assert f"past {MAX_BODY_BYTES} bytes" in str(letter.reason)
    # The letter's body is the envelope the bomb came in, the compressed bytes inside.
    assert json.loads(letter.body)["headers"]["compression"] == "application/x-bz2"


def test_a_producers_headers_do_not_make_a_notification_unreadable(
    settings_: Settings, embedded_index: EmbeddedEngine
) -> None:
    """What the channel could not read it marks in the envelope, beside kombu's keys,
    where producers write nothing. Headers claiming it are a producer's headers like any
    other: an adversarial probe had a good notification dead-lettered ``too_large`` with
    a reason of its choosing, by setting the two that the channel's mark also sets."""
    good = poison.good(seed=5)
    forged = {UNREADABLE_HEADER: "spoof", UNREADABLE_CODE_HEADER: "too_large"}
    publish_bodies(settings_, [novagen.body(good)], headers=forged)
    with running_indexer(settings_, embedded_index) as consumer:
        wait_for(lambda: consumer.acked >= 1, 60, "the message acked")
    assert (consumer.totals["indexed"], consumer.totals["dead"]) == (1, 0)
    assert embedded_index.get("instance", poison.data(good)["uuid"]) is not None
    assert letters(settings_) == []


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


def test_a_channel_holding_unacked_messages_closes_cleanly_when_its_server_died(
    settings_: Settings,
) -> None:
    """Cellsight's channel restores what is unacked before kombu does; when the server
    had died, that failed and left kombu's record marked restored with the messages still
    in it, so kombu's own restore failed its assert: the indexer whose bus was killed
    exited with ``internal error: AssertionError`` instead of reconnecting (twice in CI,
    ``test_bus_revival``). Closing is now an outage like any other: a connection error."""
    with build_bus(settings_) as bus, bus.connection() as conn:
        queue = queues.indexer_queue(settings_.indexer_queue, settings_.exchange)
        channel = conn.channel()
        queue(channel).declare()
        conn.Producer(channel).publish(b"{}", exchange=queue.exchange, routing_key=KEY)
        got: list[Any] = []
        with Consumer(channel, queues=[queue], callbacks=[lambda b, m: got.append(m)]):
            conn.drain_events(timeout=10)
            assert len(got) == 1  # delivered, not acked: kombu's record holds it
            kill_embedded_redis_servers(settings_.data_dir.parent)
            wait_for(lambda: not embedded_redis_servers(settings_.data_dir.parent), 10, "gone")
            # The server is gone: a connection error, which the indexer reconnects from.
            with contextlib.suppress(*conn.connection_errors):
                channel.close()
