"""The embedded Redis server SIGKILLed under a running indexer (``cellsight indexer``, with
``--workers``, and the demo, whose indexer runs in the API's process) comes back by
itself: nothing is restarted, one server results, and every change made meanwhile and
after is indexed (a publish that found the bus down waits in its cell's outbox for the
relay). A server that cannot persist (a full disk) is waited out the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.operations import Operations
from cellsight.clients import build_bus, build_notifier, dead_letter_queue, indexer_queue
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications.bus import Bus
from cellsight.notifications.embedded import REGISTRY
from cellsight.notifications.notifier import Notifier
from cellsight.settings import Settings, load_settings
from tests.support.drift import index_matches
from tests.support.indexing import bus_settings, embedded_redis, sqlite_cluster, wait_for
from tests.support.refusals import unpersisting
from tests.support.services import embedded_redis_servers
from tests.support.waiting import alive


def _kill_the_bus(under: Path) -> int:
    """SIGKILL the one embedded redis-server under ``under``; its pid, once it is gone."""
    [pid] = embedded_redis_servers(under)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), timeout=10, what=f"redis-server {pid} gone")
    return pid


def _changes(ops: Operations, tag: str) -> list[str]:
    made = ops.boot(BootRequest(f"vm-{tag}", "m1.small", project_id="p1", user_id="u", count=4))
    uuids = [p.uuid for p in made.instances]
    for i, vm in enumerate(uuids):
        ops.rename(vm, f"{tag}-{i}")
    ops.delete(uuids[-1])
    return uuids


def _cluster(
    tmp_path: Path,
) -> tuple[Settings, CellRegistry, Bus, Notifier, Operations, EmbeddedEngine]:
    """Two SQLite cells on the embedded bus, operations on them, and the index."""
    settings = bus_settings(tmp_path / "data", "embedded")
    registry = sqlite_cluster(settings)
    # A producer beside the indexer, on the server it started: it cannot start another.
    # Without retries, what it publishes while the bus is down waits in the cells'
    # outboxes for the relay beside the indexer.
    bus = build_bus(settings)
    notifier = Notifier.on_bus(
        bus,
        close_bus=False,
        retry_policy={"max_retries": 0},
        declare_queues=[dead_letter_queue(settings), indexer_queue(settings)],
    )
    ops = Operations(registry, notifier, publisher_id="test")
    return settings, registry, bus, notifier, ops, EmbeddedEngine(settings.index_path)


def _indexer(settings: Settings, workers: int) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        {
            "CELLSIGHT_BATCH_AGE_MS": "50",
            "CELLSIGHT_OUTBOX_RELAY_INTERVAL": "0.5",  # what the outage left in outboxes
            "COLUMNS": "250",  # one line per message from the console
        }
    )
    command = [sys.executable, "-m", "cellsight", "--data-dir", str(settings.data_dir)]
    proc = subprocess.Popen(
        [*command, "indexer", "--workers", str(workers)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    consuming = 0
    while consuming < workers:  # each consumer prints its engine and queue once it consumes
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=30)
        consuming += ", queue " in line
    return proc


@pytest.mark.parametrize("workers", [1, 2])
def test_the_indexer_brings_a_killed_bus_back_and_indexes_everything(
    tmp_path: Path, workers: int
) -> None:
    settings, registry, bus, notifier, ops, engine = _cluster(tmp_path)
    proc = _indexer(settings, workers)
    try:
        uuids = _changes(ops, "before")
        wait_for(lambda: index_matches(registry, engine), 60, "index == cells before the kill")
        dead = _kill_the_bus(tmp_path)
        uuids += _changes(ops, "after")
        try:
            wait_for(lambda: index_matches(registry, engine), 60, "index == cells after the kill")
        except AssertionError as exc:
            # What the indexer said is the only account of why (one CI run timed out here).
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"{exc}\nindexer exit {proc.returncode}:\n{out}\n{err}") from exc
        # Every worker revived (each lost its connection): one server came of it.
        servers = embedded_redis_servers(tmp_path)
        assert len(servers) == 1 and servers != [dead]
        assert engine.count("instance") == len(uuids)
        assert proc.poll() is None  # the same indexer all along
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "was gone; started" in err, err
    notifier.close()
    bus.close()  # the last handle, opened before the kill, stops the revived server
    assert not embedded_redis_servers(tmp_path)
    assert not (settings.bus_dir / REGISTRY).exists()
    engine.close()
    registry.close()


def test_the_demo_brings_a_killed_bus_back(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "demo.out"
    command = [sys.executable, "-m", "cellsight", "--data-dir", str(data), "demo"]
    args = ["--cells", "1", "--instances", "20", "--port", "0", "--interval", "0.5"]
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [*command, *args], stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    notifier = None
    try:
        wait_for(lambda: "curl " in out.read_text() or proc.poll() is not None, 180, "the demo")
        assert proc.poll() is None, out.read_text()
        settings = load_settings(data_dir=data)
        registry = CellRegistry.from_settings(settings)
        engine = EmbeddedEngine(settings.index_path)
        notifier = build_notifier(settings)  # attached before the kill: starts no server
        ops = Operations(registry, notifier, publisher_id="test")
        dead = _kill_the_bus(tmp_path)
        # The demo's live stream goes on meanwhile; so do this producer's changes.
        _changes(ops, "after")
        wait_for(lambda: index_matches(registry, engine), 90, "index == cells after the kill")
        servers = embedded_redis_servers(tmp_path)
        assert len(servers) == 1 and servers != [dead]
        engine.close()
        registry.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if notifier is not None:
            notifier.close()
    assert "was gone; started" in out.read_text()
    assert not embedded_redis_servers(tmp_path)


REFUSAL = "bus unavailable (the Redis server refuses writes: its last snapshot failed"


class _Said:
    """What a process writes to stderr, read as it comes (on a thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def all(self) -> str:
        self._thread.join(30)
        return "".join(self.lines)


def test_the_indexer_waits_out_a_bus_that_cannot_persist_and_indexes_everything(
    tmp_path: Path,
) -> None:
    """Before, the indexer exited 1 at the first refusal, and so did every restart until
    the disk had room (an adversarial probe filled the data directory)."""
    settings, registry, bus, notifier, ops, engine = _cluster(tmp_path)
    procs = [_indexer(settings, 1)]
    said = [_Said(procs[0])]
    try:
        uuids = _changes(ops, "before")
        wait_for(lambda: index_matches(registry, engine), 60, "index == cells before")
        with embedded_redis(settings) as client, unpersisting(client):
            uuids += _changes(ops, "during")  # their publishes fail: they wait in outboxes
            procs.append(_indexer(settings, 1))  # as a service manager's restart would
            said.append(_Said(procs[1]))
            wait_for(lambda: all(s.has(REFUSAL) for s in said), 60, "each indexer refused")
            assert [p.poll() for p in procs] == [None, None]
            assert engine.count("instance") < len(uuids)
        uuids += _changes(ops, "after")
        wait_for(lambda: index_matches(registry, engine), 90, "index == cells after")
        assert engine.count("instance") == len(uuids)
        assert [p.poll() for p in procs] == [None, None]  # the same indexers all along
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    for proc, s in zip(procs, said, strict=True):
        assert proc.returncode == 0, s.all()
    notifier.close()
    bus.close()
    engine.close()
    registry.close()
