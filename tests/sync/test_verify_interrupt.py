"""An interrupted ``index verify`` stops: its cells' threads at their next difference
rather than after finishing their comparison and repairs, and SIGTERM as Ctrl-C (one
line, exit 130, the maintenance lock released)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cellsight.cells.mappings import CellRegistry
from cellsight.clients import build_engine
from cellsight.indexer.lock import is_free, lock_key
from cellsight.indexer.sync import SyncOptions, run_sync
from cellsight.indexer.verify import Verifier
from cellsight.settings import Settings
from tests.support.sync_world import seeded_settings
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PER_CELL = 1500


@pytest.fixture
def drifted(tmp_path: Path) -> Settings:
    """Two synced cells whose documents were all deleted behind the index's back."""
    settings = seeded_settings(tmp_path / "data", instances_per_cell=PER_CELL)
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


def test_sigterm_stops_a_verify_as_ctrl_c_does(drifted: Settings) -> None:
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
    # Released: the next run may go.
    assert is_free(engine.get_meta(lock_key("instance")), datetime.now(UTC))
    engine.close()
