"""Dead letters on the embedded Redis bus that its channel could not read, or that
kombu could not send, are read, kept and replayed (``notifications.redis_transport``,
``cellsight.indexer.dlq``).

A letter the indexer made of what the channel could not read carries the route it was
published with, and ``dlq replay`` puts it back by that route. A letter that is no
envelope, one whose delivery tag redis-py cannot send and one whose reason quotes a
lone surrogate are read by ``dlq peek`` and ``dlq list`` and left where they are; and
``dlq list`` stops the embedded server it started.
"""

from __future__ import annotations

import bz2

import pytest
import redis
from typer.testing import CliRunner

from cellsight.cli import app
from cellsight.cli.groups import register
from cellsight.clients import build_bus
from cellsight.indexer.dlq import get_as_stored, replay
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from cellsight.notifications.embedded import socket_path
from cellsight.notifications.limits import MAX_BODY_BYTES
from cellsight.notifications.unreadable import UNREADABLE_HEADER
from cellsight.settings import Settings
from tests.support.indexing import embedded_redis, publish_bodies, running_indexer, wait_for
from tests.support.redis_envelopes import (
    KEY,
    an_envelope,
    broken,
    letters,
    set_field,
)

register(app)


def test_letters_the_channel_could_not_read_are_replayed_by_their_route(
    settings_: Settings, embedded_index: EmbeddedEngine
) -> None:
    """A bomb's letter carried the indexer queue's name as its routing key (the channel
    delivers what it could not read from that queue), and ``dlq replay`` refused it on
    every run, with the letters behind it (found by a probe). It now carries the route
    it was published with; bytes that are no envelope have none, and take replay's."""
    bomb = bz2.compress(b"0" * (MAX_BODY_BYTES + 1))
    publish_bodies(settings_, [bomb], headers={"compression": "application/x-bz2"})
    with embedded_redis(settings_) as client:
        client.lpush(settings_.indexer_queue, b"\x00 not an envelope")
    with running_indexer(settings_, embedded_index) as consumer:
        wait_for(lambda: consumer.acked >= 2, 60, "both messages acked")
    by_code = {letter.reason_code: letter for letter in letters(settings_)}
    assert (by_code["too_large"].routing_key, by_code["malformed"].routing_key) == (KEY, "")
    with build_bus(settings_) as bus, bus.connection() as conn:
        replayed = replay(
            conn,
            exchange_name=settings_.exchange,
            dlx_name=settings_.dead_letter_exchange,
            dlq_name=settings_.dead_letter_queue,
        )
    assert replayed == (2, 0, 0)
    assert letters(settings_) == []
    with embedded_redis(settings_) as client:  # back on the indexer's queue, both
        assert client.llen(settings_.indexer_queue) == 2


def test_dlq_list_stops_the_embedded_server_it_started(settings_: Settings) -> None:
    """Reading letters it does not ack, ``dlq list`` left the server running after it
    exited: kombu restored them on connections it opened after closing its pools, and
    never closed (found by a probe). The last client out stops the server."""
    with build_bus(settings_) as bus, bus.connection() as conn:
        dlq = queues.dead_letter_queue(
            settings_.dead_letter_queue, queues.dead_letter_exchange(settings_.dead_letter_exchange)
        )
        dlq(conn).declare()
        conn.Producer().publish(b"a letter", exchange=dlq.exchange, routing_key=KEY)
    socket = str(socket_path(settings_.bus_dir))
    with pytest.raises(redis.ConnectionError):  # the publisher was the last one out
        redis.Redis(unix_socket_path=socket).ping()
    result = CliRunner().invoke(app, ["--data-dir", str(settings_.data_dir), "dlq", "list"])
    assert result.exit_code == 0 and "1 dead letter(s) shown" in result.output, result.output
    with pytest.raises(redis.ConnectionError):
        redis.Redis(unix_socket_path=socket).ping()
    assert len(letters(settings_)) == 1  # still there: read, not taken


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


def test_dlq_list_reads_unsendable_letters_and_keeps_them(settings_: Settings) -> None:
    """A letter whose delivery tag redis-py cannot send, and one whose reason quotes a lone
    surrogate, beside bytes that are no envelope: ``dlq list`` shows all three and
    leaves them. Before, the first stopped it with an internal error after kombu had
    taken it off the list, the letter lost; the second stopped it printing."""
    envelope = an_envelope(settings_)
    with build_bus(settings_) as bus, bus.connection() as conn:
        dlx = queues.dead_letter_exchange(settings_.dead_letter_exchange)
        queues.dead_letter_queue(settings_.dead_letter_queue, dlx)(conn.channel()).declare()
    # Routed as the indexer routes its letters: kombu restores a letter by its route.
    envelope["properties"]["delivery_info"] = {
        "exchange": settings_.dead_letter_exchange,
        "routing_key": settings_.dead_letter_queue,
    }
    quoting = set_field(
        "headers", {"x-cellsight-reason": "bad \ud800", "x-cellsight-reason-code": "malformed"}
    )
    items = [
        b"\x00 not an envelope",
        broken(envelope, set_field("properties.delivery_tag", "\ud800")),
        broken(envelope, quoting),
    ]
    with embedded_redis(settings_) as client:
        for item in items:
            client.lpush(settings_.dead_letter_queue, item)
    result = CliRunner().invoke(app, ["--data-dir", str(settings_.data_dir), "dlq", "list"])
    assert result.exit_code == 0, result.output
    assert "bad \\ud800" in result.output
    assert len(letters(settings_)) == 3
    with embedded_redis(settings_) as client:
        assert client.llen(settings_.dead_letter_queue) == 3
        assert client.hlen("unacked") == 0
