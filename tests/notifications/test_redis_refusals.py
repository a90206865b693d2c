"""A Redis bus that cannot persist (a full disk) turns writes away with ``MISCONF`` until
it can again: publishers and consumers see ``WritesRefused``, a connection error they
wait out, and nothing published before is lost (``redis_refusals``). An error the server
answers for good stays what it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Consumer
from kombu.exceptions import OperationalError

from cellsight.notifications import queues
from cellsight.notifications.bus import open_bus, turned_away
from cellsight.notifications.envelope import Notification
from cellsight.notifications.errors import PublishError
from cellsight.notifications.notifier import Notifier
from cellsight.notifications.redis_refusals import RefusalAwareRedis, WritesRefused, refusal_reason
from tests.support.refusals import unpersisting

HEALTHY = {
    "aof_enabled": 1,
    "aof_last_write_status": "ok",
    "rdb_last_bgsave_status": "ok",
    "maxmemory": 0,
    "maxmemory_policy": "noeviction",
    "used_memory": 10**9,
}


@pytest.mark.parametrize(
    ("changes", "ping_refused", "reason"),
    [
        ({}, False, None),
        ({}, True, "it cannot persist"),
        ({"aof_last_write_status": "err"}, True, "it cannot append to its log"),
        ({"aof_enabled": 0, "aof_last_write_status": "err"}, True, "it cannot persist"),
        ({"rdb_last_bgsave_status": "err"}, True, "its last snapshot failed"),
        # A failed snapshot stops no write when the server is told not to: PING says.
        ({"rdb_last_bgsave_status": "err"}, False, None),
        ({"maxmemory": 10**9}, False, "it is at its memory limit"),
        ({"maxmemory": 10**9, "maxmemory_policy": "volatile-lru"}, False, "it is at its"),
        ({"maxmemory": 10**9, "maxmemory_policy": "allkeys-lru"}, False, None),  # evicts
        ({"maxmemory": 10**9 + 1}, False, None),
        ({"maxmemory": None, "used_memory": None}, False, None),  # fields absent
    ],
)
def test_the_server_says_whether_it_turns_writes_away(
    changes: dict[str, Any], ping_refused: bool, reason: str | None
) -> None:
    said = refusal_reason(HEALTHY | changes, ping_refused=ping_refused)
    assert said == reason if reason is None else said is not None and said.startswith(reason)


def test_publishers_and_consumers_wait_out_a_server_that_cannot_persist(
    tmp_path: Path, sample_notifications: list[Notification], drain: Callable[..., list]
) -> None:
    notifications = sample_notifications[:3]
    with open_bus(None, tmp_path / "bus", timeout=5) as bus:
        assert bus.server is not None
        client = redis.Redis(unix_socket_path=str(bus.server.socket))
        notifier = Notifier.on_bus(bus, close_bus=False, retry_policy={"max_retries": 0})
        queue = queues.indexer_queue("refusals", notifier.exchange)
        with bus.connection() as conn:
            queue(conn.channel()).declare()
        notifier.publish_many(notifications[:2])
        consuming = bus.connection()
        try:
            with Consumer(consuming, [queue], accept=["json"]), unpersisting(client):
                with pytest.raises(PublishError, match="refuses writes: its last snapshot failed"):
                    notifier.publish(notifications[2])
                # A consumer's take is a script that moves the message: refused too, and
                # told from an error for good by the server's own account.
                with pytest.raises(WritesRefused, match="its last snapshot failed") as err:
                    consuming.drain_events(timeout=2)
                assert turned_away(err.value)
                assert isinstance(err.value, tuple(consuming.connection_errors))
                # A connection made meanwhile (kombu raises its own error from it where
                # it connects for a consumer).
                with bus.connection() as conn, pytest.raises(WritesRefused):
                    conn.channel()
                with bus.connection() as conn, pytest.raises(OperationalError) as failed:
                    _ = conn.default_channel
                assert turned_away(failed.value)
            notifier.publish(notifications[2])
            with bus.connection() as conn:
                got = drain(conn, queue, 3)
            assert [body for _, body in got] == [n.to_oslo() for n in notifications]
        finally:
            consuming.release()
            notifier.close()
            client.close()


def test_an_error_for_good_is_not_taken_for_a_refusal(tmp_path: Path) -> None:
    with open_bus(None, tmp_path / "bus", timeout=5) as bus:
        assert bus.server is not None
        client = RefusalAwareRedis(unix_socket_path=str(bus.server.socket))
        try:
            client.set("text", "not a list")
            with pytest.raises(redis.ResponseError, match="WRONGTYPE") as err:
                client.lpush("text", "item")
            assert not isinstance(err.value, WritesRefused)
            with pytest.raises(redis.ResponseError, match="WRONGTYPE") as err:
                pipe = client.pipeline()
                pipe.lpush("text", "item")
                pipe.execute()
            assert not isinstance(err.value, WritesRefused)
            # A snapshot that fails where the server is told to go on writing: the error
            # is the command's own (a review found it taken for a refusal).
            client.config_set("stop-writes-on-bgsave-error", "no")
            with unpersisting(client):
                with pytest.raises(redis.ResponseError, match="WRONGTYPE") as err:
                    client.lpush("text", "item")
                assert not isinstance(err.value, WritesRefused)
                assert client.set("other", "value")
            client.config_set("stop-writes-on-bgsave-error", "yes")
            with unpersisting(client):
                with pytest.raises(WritesRefused, match="its last snapshot failed"):
                    client.lpush("text", "item")
                with pytest.raises(WritesRefused, match="its last snapshot failed"):
                    pipe = client.pipeline()
                    pipe.set("other", "value")
                    pipe.execute()
                with pytest.raises(WritesRefused, match="its last snapshot failed"):
                    client.ping()  # Redis refuses even PING then
                assert client.get("text") == b"not a list"  # reads go on
            assert client.lpush("list", "item") == 1
        finally:
            client.close()
