"""An interrupted ``index verify`` stops: its cells' threads at their next difference
rather than after finishing their comparison and repairs, and SIGTERM as Ctrl-C (one
line, exit 130, the maintenance lock released)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.mappings import CellRegistry
from cellsight.clients import build_engine
from cellsight.indexer import daemon_map
from cellsight.indexer.antientropy import verify_resource
from cellsight.indexer.engines.base import WriteOp, WriteResult
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.index_roles import LAST_VERIFY
from cellsight.indexer.lock import LockLost, MaintenanceLock, is_free, lock_key
from cellsight.indexer.sync import SyncOptions, run_sync
from cellsight.indexer.verify import Verifier
from cellsight.indexer.verify_report import VerifyInterrupted
from cellsight.indexer.write_gate import LinkedStop, WriteGate
from cellsight.settings import Settings
from tests.support.sync_world import seeded_settings
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PER_CELL = 1500


@pytest.fixture
def drifted(tmp_path: Path) -> Settings:
    """Two synced cells whose documents were all deleted behind the index's back."""
    return _drifted(tmp_path, PER_CELL)


def _drifted(tmp_path: Path, per_cell: int) -> Settings:
    settings = seeded_settings(tmp_path / "data", instances_per_cell=per_cell)
    registry = CellRegistry.from_settings(settings)
    engine = build_engine(settings)
    run_sync(engine, registry, SyncOptions())
    engine.delete("instance", [doc_id for doc_id, _ in engine.iter_versions("instance")])
    engine.close()
    registry.close()
    return settings


def test_an_interrupted_verify_stops_its_cells_at_once(drifted: Settings) -> None:
    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)
    seen: list[int] = []

    def progress(cell_uuid: str, n: int) -> None:
        seen.append(n)
        if len(seen) == 1:
            # Ctrl-C while a cell's thread compares: the caller's thread gets it.
            os.kill(os.getpid(), signal.SIGINT)
            assert verifier._stop.wait(30), "the interrupted run did not tell its cells"

    verifier = Verifier(
        engine, registry, "instance", repair=True, batch_size=100, workers=1,
        on_progress=progress,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        verifier.run(registry.list_cells())
    # Stopped at its first chunk of 100 rows: the first cell went no further and the
    # second, already queued, did not start comparing (each would report its progress).
    assert seen == [100]
    assert engine.count("instance") < PER_CELL
    engine.close()
    registry.close()


def test_an_interrupted_verify_leaves_no_write_under_way(
    drifted: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync probe: SIGTERM to ``verify --repair --workers 60`` left threads queued for
    the embedded engine's write lock inside SQLite, where no stop is seen; the caller
    released its lock and closed the engine under them (SIGSEGV), and they wrote after
    the lock read as released. Here another connection holds the write lock when the
    run is interrupted, and lets go only after the run's grace for its threads."""
    monkeypatch.setattr(daemon_map, "GRACE", 0.5)
    registry = CellRegistry.from_settings(drifted)
    path = build_engine(drifted).path  # type: ignore[attr-defined]
    engine = EmbeddedEngine(path, timeout=30)  # SQLite's busy wait outlasts the grace
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    writing, entered = [0], threading.Event()
    count = threading.Lock()
    bulk = engine.bulk

    def watched(ops: Sequence[WriteOp]) -> Sequence[WriteResult]:
        with count:
            writing[0] += 1
        entered.set()
        try:
            return bulk(ops)
        finally:
            with count:
                writing[0] -= 1

    monkeypatch.setattr(engine, "bulk", watched)

    def interrupt_when_a_write_waits() -> None:
        assert entered.wait(60)
        os.kill(os.getpid(), signal.SIGINT)
        assert verifier._stop.wait(30)
        # Past the run's grace: before the fix, the run had returned by now.
        threading.Event().wait(daemon_map.GRACE + 1.0)
        blocker.rollback()

    verifier = Verifier(engine, registry, "instance", repair=True, workers=2)
    interrupter = threading.Thread(target=interrupt_when_a_write_waits)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        verifier.run(registry.list_cells())
    with count:
        assert writing[0] == 0, "the run returned with a repair write still under way"
    interrupter.join(30)
    blocker.close()
    engine.close()
    registry.close()


def test_a_verify_that_lost_its_lock_repairs_no_more(drifted: Settings) -> None:
    """A sync probe: verify never looked at its lock between repairs, as sync and purge
    do, so one paused past the lock's expiry went on repairing beside the new holder."""
    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)
    checks: list[int] = []

    def taken_over() -> None:
        checks.append(1)
        raise LockLost("the instance lock was lost (taken over: pid 1)")

    verifier = Verifier(engine, registry, "instance", repair=True, check=taken_over)
    # The run fails as a lost lock, as sync's and purge's do: it was read as failed
    # cells and a drift verdict that never said the lock was lost (a review).
    with pytest.raises(LockLost) as lost:
        verifier.run(registry.list_cells())
    assert engine.count("instance") == 0  # not one repair written
    assert checks
    assert str(lost.value) == (
        "instance verify stopped: the instance lock was lost (taken over: pid 1); "
        "0 repaired before it stopped"
    )
    engine.close()
    registry.close()


def test_sigterm_stops_a_verify_as_ctrl_c_does(tmp_path: Path) -> None:
    # Enough to repair that a loaded machine's test still finds the run under way (with
    # PER_CELL, one run under load finished before it was seen holding its lock).
    drifted = _drifted(tmp_path, 4 * PER_CELL)
    command = [sys.executable, "-c", "from cellsight.cli import main; main()"]
    verify = subprocess.Popen(
        [*command, "--data-dir", str(drifted.data_dir), "index", "verify", "--repair",
         "--type", "instance", "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    engine = build_engine(drifted)

    def holds_the_lock() -> bool:
        assert verify.poll() is None, "the verify ended before it could be stopped"
        return (engine.get_meta(lock_key("instance")) or {}).get("pid") == verify.pid

    wait_for(holds_the_lock, 60, "the verify holding its lock")
    verify.send_signal(signal.SIGTERM)
    _, stderr = verify.communicate(timeout=60)
    assert verify.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "interrupted" in lines[0]
    # What it did, from a sync probe: "interrupted" alone said the same for none and all.
    assert lines[0].startswith("error: instance verify interrupted: "), lines
    assert lines[0].endswith(" repaired before it stopped"), lines
    # Released: the next run may go.
    assert is_free(engine.get_meta(lock_key("instance")), datetime.now(UTC))
    engine.close()


def test_an_interrupt_before_the_cells_are_compared_still_says_what_was_repaired(
    drifted: Settings,
) -> None:
    """CI: a SIGTERM that landed just after the lock was taken, before the cells'
    comparison began, said a bare "interrupted"."""
    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)

    def interrupted(cells: Sequence[tuple[str, str]]) -> None:
        raise KeyboardInterrupt

    # Caught as any interrupt, so a bare one fails this test rather than the session.
    with pytest.raises(KeyboardInterrupt) as stopped:
        verify_resource(engine, registry, "instance", repair=True, on_start=interrupted)
    assert isinstance(stopped.value, VerifyInterrupted), repr(stopped.value)
    assert str(stopped.value) == "instance verify interrupted: 0 repaired before it stopped"
    assert engine.count("instance") == 0
    assert is_free(engine.get_meta(lock_key("instance")), datetime.now(UTC))
    # A verify that repairs nothing is interrupted as any command is.
    with pytest.raises(KeyboardInterrupt) as plain:
        verify_resource(engine, registry, "instance", on_start=interrupted)
    assert not isinstance(plain.value, VerifyInterrupted)
    engine.close()
    registry.close()


def test_an_interrupt_as_the_lock_is_taken_releases_it(drifted: Settings) -> None:
    engine = build_engine(drifted)

    class InterruptedOnceTaken(MaintenanceLock):
        def acquire(self) -> None:
            super().acquire()
            raise KeyboardInterrupt  # as the heartbeat starts, say

    with pytest.raises(KeyboardInterrupt), InterruptedOnceTaken(engine, "instance", "verify"):
        pass
    # Not held until its expiry: the next run may go at once.
    assert is_free(engine.get_meta(lock_key("instance")), datetime.now(UTC))
    engine.close()


def test_a_second_interrupt_while_the_writes_drain_still_says_what_was_repaired(
    drifted: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: Ctrl-C again while the run waited (up to a minute) for a repair write
    under way lost the "N repaired" line to a bare "interrupted". The lock is then left
    to expire, not released: the writes may still be under way."""
    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)
    seen: list[int] = []

    def progress(cell_uuid: str, n: int) -> None:
        seen.append(n)
        if len(seen) == 7:  # a first chunk of 500 repaired, then Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)

    drain = WriteGate.drain

    def impatient(self: WriteGate, timeout: float | None = None) -> bool:
        def second_ctrl_c(*args: object, **kwargs: object) -> bool:
            raise KeyboardInterrupt  # while the first one's drain waits

        setattr(self._free, "acquire", second_ctrl_c)  # noqa: B010 - a method, mypy's
        return drain(self, timeout)

    monkeypatch.setattr(WriteGate, "drain", impatient)
    with pytest.raises(KeyboardInterrupt) as stopped:
        verify_resource(
            engine, registry, "instance", repair=True, batch_size=100, workers=1,
            on_progress=progress,
        )  # fmt: skip
    assert isinstance(stopped.value, VerifyInterrupted), repr(stopped.value)
    repaired = engine.count("instance")
    assert repaired > 0
    assert str(stopped.value) == (
        f"instance verify interrupted: {repaired:,} repaired before it stopped"
    )
    held = engine.get_meta(lock_key("instance")) or {}
    assert held.get("pid") == os.getpid() and not held.get("released"), held
    engine.close()
    registry.close()


def test_an_interrupt_after_the_comparison_still_says_what_was_repaired(
    drifted: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: an interrupt as the run's figures are kept for ``index status``, after
    its lock was given back, said a bare "interrupted" about all it had repaired."""
    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)
    put = engine.put_meta

    def interrupted(key: str, value: Any) -> None:
        if key == LAST_VERIFY.format(resource="instance"):
            raise KeyboardInterrupt
        put(key, value)

    monkeypatch.setattr(engine, "put_meta", interrupted)
    with pytest.raises(KeyboardInterrupt) as stopped:
        verify_resource(engine, registry, "instance", repair=True)
    assert isinstance(stopped.value, VerifyInterrupted), repr(stopped.value)
    assert engine.count("instance") == 2 * PER_CELL  # all of it repaired
    assert str(stopped.value) == (
        f"instance verify interrupted: {2 * PER_CELL:,} repaired before it stopped"
    )
    engine.close()
    registry.close()


@pytest.mark.parametrize(
    ("stop", "code", "said"),
    [
        (KeyboardInterrupt, 130, "node verify interrupted: 0 repaired before it stopped"),
        (lambda: LockLost("the node lock was lost"), 1, "the node lock was lost"),
    ],
    ids=["interrupted", "lock-lost"],
)
def test_an_interrupted_run_of_both_types_says_what_the_first_repaired(
    drifted: Settings, monkeypatch: pytest.MonkeyPatch, stop: Any, code: int, said: str
) -> None:
    """A review: interrupted in its node pass, ``index verify --repair`` said "node verify
    interrupted: 0 repaired" of a run whose instance pass had repaired every document,
    and never printed that pass's report."""
    from typer.testing import CliRunner

    from cellsight.cli import app

    run = Verifier.run

    def node_interrupted(self: Verifier, cells: Any, **options: Any) -> Any:
        if self.resource == "node":
            raise stop()  # Ctrl-C, or its lock lost, as the node pass begins
        return run(self, cells, **options)

    monkeypatch.setattr(Verifier, "run", node_interrupted)
    result = CliRunner().invoke(
        app, ["--data-dir", str(drifted.data_dir), "index", "verify", "--repair"]
    )
    assert result.exit_code == code, result.output
    assert f"{said}; instance verify had ended: {2 * PER_CELL:,} repaired" in " ".join(
        result.output.split()
    ), result.output


def test_a_stopping_verify_stops_retrying_its_reads(
    drifted: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a cell's document read went on through its retries (about 24 s of
    backoff and the timeouts) after the run was interrupted or lost its lock."""
    from cellsight.indexer.engines.base import EngineUnavailable
    from cellsight.indexer.retries import RetryStopped

    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)
    reads: list[int] = []

    def busy(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        raise EngineUnavailable("busy")

    monkeypatch.setattr(engine, "get_many", busy)
    verifier = Verifier(engine, registry, "instance", repair=True, backoff=0.5)
    verifier._stop.set()  # as an interrupt or a lost lock sets it
    with pytest.raises(RetryStopped):
        verifier._stored(["2f4b0f6c-0d7a-4a43-9d0e-5c2a51a0b8a1"])
    assert reads == [1]  # not one retry after the stop
    engine.close()
    registry.close()


def test_the_indexers_periodic_verify_stops_with_it(drifted: Settings) -> None:
    """The indexer's periodic verify was not told of SIGTERM: its cells' threads went on
    comparing and repairing while the indexer closed the engine under them. Its stop now
    ends the comparison at the next chunk, as an interrupt does; a run so cut short is
    not kept as the last verify's, and its lock is given back."""
    registry = CellRegistry.from_settings(drifted)
    engine = build_engine(drifted)
    stop, seen = threading.Event(), []

    def progress(cell_uuid: str, n: int) -> None:
        seen.append(n)
        stop.set()  # the indexer's SIGTERM, while a cell is compared

    verify_resource(
        engine, registry, "instance", repair=True, workers=1, batch_size=100,
        on_progress=progress, stop=stop,
    )  # fmt: skip
    assert seen == [100]
    assert engine.count("instance") < PER_CELL
    assert engine.get_meta(LAST_VERIFY.format(resource="instance")) is None
    assert is_free(engine.get_meta(lock_key("instance")), datetime.now(UTC))
    engine.close()
    registry.close()


def test_a_verifys_own_stop_leaves_its_owners_alone() -> None:
    outer = threading.Event()
    linked = LinkedStop(outer)
    linked.set()  # a lost lock stops the run, not the indexer
    assert linked.is_set() and not outer.is_set()
    outer2 = threading.Event()
    linked2 = LinkedStop(outer2)
    outer2.set()
    assert linked2.is_set()
