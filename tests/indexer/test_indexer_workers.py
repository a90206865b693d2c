"""``cellsight indexer --workers 2``: two consumer processes share one RabbitMQ queue,
the index converges on the cells' state, and SIGTERM stops both cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from cellsight.cells.instances import BootRequest
from cellsight.cells.operations import Operations
from cellsight.clients import build_notifier
from cellsight.indexer.dlq import peek
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.settings import Settings
from tests.support.drift import index_matches
from tests.support.indexing import bus_settings, sqlite_cluster, wait_for
from tests.support.publishers import CountingPublisher

pytestmark = pytest.mark.services

STOPPED = re.compile(r"^indexer\[(\d+)\] stopped: ((?:\w+=\d+ ?)+)$")


def _workers(settings: Settings, n: int, **popen: Any) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        {
            "CELLSIGHT_BUS_URL": settings.bus_url or "",
            "CELLSIGHT_EXCHANGE": settings.exchange,
            "CELLSIGHT_INDEXER_QUEUE": settings.indexer_queue,
            "CELLSIGHT_DEAD_LETTER_EXCHANGE": settings.dead_letter_exchange,
            "CELLSIGHT_DEAD_LETTER_QUEUE": settings.dead_letter_queue,
            "CELLSIGHT_BATCH_AGE_MS": "50",
            "CELLSIGHT_BATCH_COUNT": "20",
            "COLUMNS": "250",  # one line per message from the console
        }
    )
    command = [sys.executable, "-m", "cellsight", "--data-dir", str(settings.data_dir)]
    return subprocess.Popen(
        [*command, "indexer", "--workers", str(n)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _started(proc: subprocess.Popen[str], n: int) -> str:
    """The supervisor's first line, printed once the shared parts exist and its ``n``
    workers are started: "indexer: n worker processes: [pid, ...]"."""
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(f"indexer: {n} worker processes"), first
    return first


def _consumers(settings: Settings) -> int:
    with Connection(settings.bus_url) as conn, conn.channel() as ch:
        try:
            return int(ch.queue_declare(settings.indexer_queue, passive=True).consumer_count)
        except conn.channel_errors:  # not declared yet: the workers are still starting
            return 0


def test_two_workers_converge_and_stop_on_sigterm(rabbitmq_url: str, tmp_path: Path) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    registry = sqlite_cluster(settings)
    notifier = build_notifier(settings)  # declares the queue the workers consume
    publisher = CountingPublisher(notifier)
    ops = Operations(registry, publisher, publisher_id="test")
    proc = _workers(settings, 2)
    try:
        # Both consumers attached before the stream starts, so RabbitMQ shares it out.
        wait_for(lambda: proc.poll() is None and _consumers(settings) == 2, what="2 consumers")
        uuids: list[str] = []
        for i in range(12):
            made = ops.boot(
                BootRequest(f"vm{i}", "m1.small", project_id="p1", user_id="u", count=3)
            )
            uuids += [p.uuid for p in made.instances]
        for i, vm in enumerate(uuids):
            ops.rename(vm, f"renamed-{i}")
            ops.set_tags(vm, [f"t{i % 3}", "all"])
            if i % 2:
                ops.power_off(vm)
            if i % 5 == 0:
                ops.delete(vm)
        engine = EmbeddedEngine(settings.index_path)
        wait_for(lambda: index_matches(registry, engine), timeout=120, what="index == cells")
        assert engine.count("instance") == len(uuids)
        engine.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    totals = {
        int(m.group(1)): {k: int(v) for k, v in (p.split("=") for p in m.group(2).split())}
        for m in (STOPPED.match(line.strip()) for line in out.splitlines())
        if m
    }
    assert sorted(totals) == [0, 1], out
    assert all(sum(t.values()) > 0 for t in totals.values()), totals  # both did work
    assert sum(sum(t.values()) for t in totals.values()) == publisher.count
    assert sum(t["dead"] for t in totals.values()) == 0
    assert _consumers(settings) == 0  # both channels closed
    with Connection(settings.bus_url) as conn:
        assert list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue)) == []
    notifier.close()
    registry.close()


def test_three_workers_on_a_fresh_data_dir_with_the_embedded_bus(tmp_path: Path) -> None:
    """Nothing exists yet (API database, index, bus): the workers must not race to
    create them, and the embedded bus is shared by all of them."""
    settings = bus_settings(tmp_path / "data", "embedded")
    proc = _workers(settings, 3)
    try:
        _started(proc, 3)
        registry = sqlite_cluster(settings)
        notifier = build_notifier(settings)
        ops = Operations(registry, CountingPublisher(notifier), publisher_id="test")
        made = ops.boot(BootRequest("vm", "m1.small", project_id="p1", user_id="u", count=6))
        engine = EmbeddedEngine(settings.index_path)
        wait_for(lambda: index_matches(registry, engine), timeout=120, what="index == cells")
        assert engine.count("instance") == len(made.instances)
        engine.close()
        notifier.close()
        registry.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert sorted(int(m.group(1)) for m in map(STOPPED.match, out.splitlines()) if m) == [0, 1, 2]
    assert "Traceback" not in err, err


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by whoever adopted it, maybe late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """A supervisor killed outright (SIGKILL, the OOM killer) cannot forward a signal:
    its workers, adopted by init, must notice and stop (flush, ack, exit) rather than
    keep consuming beside the indexer the service manager starts in its place."""
    settings = bus_settings(tmp_path / "data", "embedded")
    proc = _workers(settings, 2)
    pids: list[int] = []
    try:
        first = _started(proc, 2)
        assert proc.stdout is not None
        pids = [int(p) for p in re.findall(r"\d+", first.partition(":")[2].partition(":")[2])]
        assert len(pids) == 2, first
        ready = 0
        while ready < 2:  # each worker prints its engine and queue once it consumes
            line = proc.stdout.readline()
            assert line, "the workers stopped before consuming"
            ready += bool(re.match(r"^indexer\[\d\]: embedded engine", line))
        proc.kill()
        proc.wait(10)
        wait_for(lambda: not any(map(_running, pids)), timeout=30, what="workers stopped")
    finally:
        for pid in filter(_running, pids):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_workers_stopped_while_still_starting_stop_cleanly(tmp_path: Path, how: str) -> None:
    """A probe: SIGTERM just after the workers were started reached them before they set
    their handler (still importing), they died of it, and the supervisor, told to stop,
    exited 1 as if a worker had failed. A review: Ctrl-C, which the terminal sends to
    the whole process group, did the same."""
    settings = bus_settings(tmp_path / "data", "embedded")
    proc = _workers(settings, 2, start_new_session=True)  # its own process group
    try:
        first = _started(proc, 2)
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, first + out + err
    assert "workers exited with" in out, out
