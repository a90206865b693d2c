"""A producer SIGKILLed between its commit and its publish loses nothing: the
notifications wait in the cell's outbox and ``cellsight outbox relay`` delivers them,
through the real bus, to the indexer."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cellsight.cells import outbox, relay_loop
from cellsight.cells.database import connect
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.cells.reads import iter_instances
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.settings import Settings
from tests.support.drift import index_differences
from tests.support.indexing import bus_settings, running_indexer, wait_for
from tests.support.publishers import FailingPublisher

ROOT = Path(__file__).resolve().parents[2]


def _env(settings: Settings) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CELLSIGHT_DATA_DIR": str(settings.data_dir),
        "CELLSIGHT_EXCHANGE": settings.exchange,
        "CELLSIGHT_INDEXER_QUEUE": settings.indexer_queue,
        "CELLSIGHT_DEAD_LETTER_EXCHANGE": settings.dead_letter_exchange,
        "CELLSIGHT_DEAD_LETTER_QUEUE": settings.dead_letter_queue,
        # The killed producer held its cell's relay lease: the relay waits this long.
        "CELLSIGHT_OUTBOX_LEASE": "2",
    }
    if settings.bus_url:
        env["CELLSIGHT_BUS_URL"] = settings.bus_url
    return env


@pytest.mark.parametrize("bus", ["rabbitmq", "embedded"])
def test_a_producer_killed_between_commit_and_publish_loses_nothing(
    bus: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if bus == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")
    settings = bus_settings(tmp_path / "data", bus)
    registry = CellRegistry.from_settings(settings)
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    for host in ("h1", "h2"):
        add_compute_node(registry.cell_engine(cell), host)
    env = _env(settings)

    producer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.stalled_producer", "survivor"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert producer.stdout is not None
        line = producer.stdout.readline()
        assert line.strip() == "COMMITTED", line + (
            producer.stderr.read() if producer.stderr else ""
        )
        producer.send_signal(signal.SIGKILL)
    finally:
        producer.kill()
        producer.wait(30)
    assert producer.returncode == -signal.SIGKILL

    engine_db = registry.cell_engine(cell)
    with connect(engine_db) as conn:
        rows = list(iter_instances(conn))
        waiting = outbox.pending(conn)
    assert [r["display_name"] for r in rows] == ["survivor"]  # the change committed
    assert waiting == 4  # create.start, update, create.end, compute_node.update: none published
    uuid = rows[0]["uuid"]

    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    try:
        relay = subprocess.run(
            [sys.executable, "-m", "cellsight", "outbox", "relay"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert relay.returncode == 0, relay.stdout + relay.stderr
        assert "cell1: published 4, 0 left" in relay.stdout
        with connect(engine_db) as conn:
            assert outbox.pending(conn) == 0
        with running_indexer(settings, engine) as consumer:
            wait_for(lambda: consumer.totals["indexed"] >= 2, what="relayed notifications")
        stored = engine.get("instance", uuid)
        assert stored is not None and stored.document["display_name"] == "survivor"
        assert index_differences(registry, engine) == {}
    finally:
        engine.close()
        registry.close()


def test_relay_with_the_bus_down_exits_1_in_one_line_and_keeps_the_rows(tmp_path: Path) -> None:
    settings = bus_settings(tmp_path / "data", "embedded")
    registry = CellRegistry.from_settings(settings)
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    add_compute_node(registry.cell_engine(cell), "h1")
    Operations(registry, FailingPublisher()).boot(BootRequest("kept", "m1.small", "p", "u"))
    env = {
        **_env(settings),
        # Nothing listens there: every publish fails after its bounded retries.
        "CELLSIGHT_BUS_URL": "amqp://guest:guest@127.0.0.1:1//",
        "CELLSIGHT_PUBLISH_TIMEOUT": "1",
    }
    relay = subprocess.run(
        [sys.executable, "-m", "cellsight", "outbox", "relay", "--no-wait"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert relay.returncode == 1, relay.stdout + relay.stderr
    assert "cell1: published 0, 4 left" in relay.stdout
    assert relay.stderr.strip().startswith("error: outbox relay incomplete for cell1")
    assert "Traceback" not in relay.stderr
    with connect(registry.cell_engine(cell)) as conn:
        assert outbox.pending(conn) == 4
    registry.close()


def test_relay_every_keeps_running_until_sigterm(tmp_path: Path) -> None:
    settings = bus_settings(tmp_path / "data", "embedded")
    registry = CellRegistry.from_settings(settings)
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    add_compute_node(registry.cell_engine(cell), "h1")
    ops = Operations(registry, FailingPublisher())
    ops.boot(BootRequest("first", "m1.small", "p", "u"))
    engine_db = registry.cell_engine(cell)

    def waiting() -> int:
        with connect(engine_db) as conn:
            return outbox.pending(conn)

    assert waiting() == 4
    relay = subprocess.Popen(
        [sys.executable, "-m", "cellsight", "outbox", "relay", "--every", "0.2"],
        env=_env(settings),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: waiting() == 0, 60, "the first pass")
        # Still running: a change committed later is relayed by a later pass.
        ops.boot(BootRequest("second", "m1.small", "p", "u"))
        assert waiting() > 0
        wait_for(lambda: waiting() == 0, 60, "a later pass")
        assert relay.poll() is None
        relay.send_signal(signal.SIGTERM)
        # A second SIGTERM while it stops (a service manager's, an impatient operator's)
        # ended a clean stop with 143: the handlers were put back before the exit.
        assert relay.stdout is not None
        for line in relay.stdout:
            if line.strip() == "outbox relay stopped":
                relay.send_signal(signal.SIGTERM)
                break
        else:
            raise AssertionError("the relay did not say it stopped")
        out, err = relay.communicate(timeout=60)
    finally:
        relay.kill()
    assert relay.returncode == 0, out + err
    assert "Traceback" not in err
    registry.close()


def test_a_periodic_relay_warns_in_one_line_of_a_cell_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cell whose database is not one (a file replaced by something else): its outbox
    waits, which the operator hears of at WARNING, in the driver's line, not SQLAlchemy's
    statement and link (the walk-through saw them at INFO, behind -v)."""
    settings = bus_settings(tmp_path / "data", "embedded")
    registry = CellRegistry.from_settings(settings)
    registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    registry.close()  # no pooled connection keeps the real file open
    (tmp_path / "cell1.db").write_bytes(b"not a database, " * 64)
    registry = CellRegistry.from_settings(settings)
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="cellsight.cells.relay_loop"):
        thread = relay_loop.start_periodic_relay(
            registry, outbox.Outbox(FailingPublisher()), 0.01, stop
        )
        wait_for(lambda: "outbox relay cell1" in caplog.text, what="the relay's warning")
        stop.set()
        thread.join(5)
    (line,) = {r.getMessage() for r in caplog.records if "outbox relay cell1" in r.getMessage()}
    # Named as every unreadable cell is (``connect``): the cell, its file, the driver's line.
    assert line == (
        f"outbox relay cell1: cell cell1: database 'sqlite+pysqlite:///{tmp_path / 'cell1.db'}'"
        " is unavailable: file is not a database"
    )
    registry.close()
