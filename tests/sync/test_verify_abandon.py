"""An interrupted verify that gives up waiting for a repair write under way (``DRAIN``,
60 s: a frozen engine, SQLite's busy wait) released the maintenance lock over it: the
next sync or verify could start while that write might still land. The lock is now left
to expire instead (``MaintenanceLock.abandon``), its renewals stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.mappings import CellRegistry
from cellsight.clients import build_engine
from cellsight.indexer import write_gate
from cellsight.indexer.antientropy import verify_resource
from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteResult
from cellsight.indexer.lock import LockHeld, MaintenanceLock, is_free, lock_key
from cellsight.indexer.verify_report import VerifyInterrupted
from cellsight.indexer.write_gate import WriteGate
from tests.support.sync_world import make_engine, seeded_settings
from tests.support.waiting import wait_for


def test_a_drain_that_gives_up_abandons_and_one_that_ends_does_not() -> None:
    stop, abandoned = threading.Event(), []
    gate = WriteGate(1, stop, abandon=lambda: abandoned.append(1))
    stop.set()
    assert gate.drain(0.1)  # nothing under way
    assert abandoned == []
    held = WriteGate(1, stop, abandon=lambda: abandoned.append(1))
    held._free.acquire()  # a write under way that does not end
    assert not held.drain(0.1)
    assert abandoned == [1]


@pytest.fixture
def engine(request: pytest.FixtureRequest, engine_kind: str, tmp_path: Path) -> Iterator[Any]:
    eng = make_engine(request, engine_kind, tmp_path / "index.db")
    yield eng
    eng.close()


# Takes the lock, abandons it and exits: what ``index verify`` does once its drain gives up.
_ABANDONING = """
import sys
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from cellsight.indexer.lock import MaintenanceLock
kind, where, prefix = sys.argv[1:]
engine = (EmbeddedEngine if kind == "embedded" else OpenSearchEngine)(where, prefix=prefix)
with MaintenanceLock(engine, "instance", "verify", ttl=4.0, heartbeat=0.5) as lock:
    lock.abandon()
engine.close()
sys.exit(130)
"""


def test_an_abandoned_lock_outlives_its_process_until_it_expires(
    engine: SearchEngine, engine_kind: str
) -> None:
    """A review: left unreleased, the lock was still free at once for the next run on the
    same host, its holder's process being gone (the CLI exits right after the drain)."""
    where = str(getattr(engine, "path", None) or getattr(engine, "url", ""))
    argv = [sys.executable, "-c", _ABANDONING, engine_kind, where, engine.prefix]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    held = engine.get_meta(lock_key("instance"))
    assert held is not None and held["abandoned"] and held["pid"] != os.getpid(), held
    assert not is_free(held, datetime.now(UTC))
    with pytest.raises(LockHeld, match="left to expire over a write that may still land"):
        MaintenanceLock(engine, "instance", "sync").acquire()
    wait_for(
        lambda: is_free(engine.get_meta(lock_key("instance")), datetime.now(UTC)),
        30,
        "the abandoned lock to expire",
    )
    with MaintenanceLock(engine, "instance", "sync"):
        pass


def test_an_abandoned_lock_is_not_renewed(engine: SearchEngine) -> None:
    # Its expiry within a heartbeat: a lock asked whether it holds renews itself first.
    lock = MaintenanceLock(engine, "instance", "verify", ttl=2.0, heartbeat=5.0)
    with lock:
        lock.abandon()
        stamped = engine.get_meta(lock_key("instance"))
        assert stamped is not None and stamped["abandoned"]
        assert lock.holds(fresh=True)
        assert engine.get_meta(lock_key("instance")) == stamped


def test_a_verify_interrupted_over_a_stuck_write_leaves_its_lock_to_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_gate, "DRAIN", 0.5)
    settings = seeded_settings(tmp_path / "data", instances_per_cell=300)
    registry = CellRegistry.from_settings(settings)
    engine = build_engine(settings)  # an empty index: every row is missing, to repair
    entered, let_go, ended = threading.Event(), threading.Event(), threading.Event()
    bulk = engine.bulk

    def stuck(ops: Sequence[WriteOp]) -> Sequence[WriteResult]:
        entered.set()
        let_go.wait(60)
        try:
            return bulk(ops)
        finally:
            ended.set()

    monkeypatch.setattr(engine, "bulk", stuck)

    def interrupt_when_a_write_is_under_way() -> None:
        assert entered.wait(60)
        os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_when_a_write_is_under_way)
    interrupter.start()
    try:
        with pytest.raises(VerifyInterrupted):
            verify_resource(engine, registry, "instance", repair=True, workers=1)
        interrupter.join(30)
        held = engine.get_meta(lock_key("instance")) or {}
        assert held.get("pid") == os.getpid() and not held.get("released"), held
        with pytest.raises(LockHeld):
            MaintenanceLock(engine, "instance", "sync").acquire()
    finally:
        let_go.set()
    # The write that outlived the run lands now: the engine is closed only after it.
    assert ended.wait(60)
    engine.close()
    registry.close()
