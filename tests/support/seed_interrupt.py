"""Runs the ``cellsight`` entry point with a signal injected into a seed at a chosen
point, so an interrupted seed is tested the same way every run (no sleeps):

    python -m tests.support.seed_interrupt --data-dir D cells seed …

``SEED_SIGNAL`` (``INT``, ``TERM`` or ``KILL``) is sent once ``SEED_AFTER`` rows were reported
on the progress bar: to this process alone, or with ``SEED_TO_GROUP=1`` to its process
group, as a terminal's Ctrl-C is (start it in a session of its own). When the seed's
undo starts, what it finds is written as JSON to ``SEED_REPORT``: the seed's worker
processes still alive and each SQLite file's instance rows, which say whether the
workers stopped (and stopped writing) before the clean-up; before a ``KILL``, the
worker processes' pids are written there instead. ``SEED_CPUS`` sets the CPU count
the seed sees, which sets its number of workers.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import rich.progress

from cellsight.cells import seed_undo
from cellsight.cells.mappings import CellRegistry
from tests.support.waiting import spawned


def _rows(path: Path) -> int | None:
    if not path.exists():
        return None
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT count(*) FROM instances").fetchone()[0])


def _install() -> None:
    if cpus := os.environ.get("SEED_CPUS"):  # the seed's default worker count
        os.cpu_count = lambda: int(cpus)
    sig = getattr(signal, f"SIG{os.environ['SEED_SIGNAL']}")
    after = int(os.environ["SEED_AFTER"])
    to_group = os.environ.get("SEED_TO_GROUP") == "1"
    reported = [0]
    advance = rich.progress.Progress.advance

    def advancing(self: rich.progress.Progress, task_id: Any, advance_by: float = 1) -> None:
        advance(self, task_id, advance_by)
        before = reported[0]
        reported[0] += int(advance_by)
        if before < after <= reported[0]:
            if sig == signal.SIGKILL:  # nothing runs after it: say who the workers are first
                Path(os.environ["SEED_REPORT"]).write_text(
                    json.dumps({"workers": spawned(os.getpid())})
                )
            if to_group:
                os.killpg(os.getpgid(0), sig)
            else:
                os.kill(os.getpid(), sig)

    rich.progress.Progress.advance = advancing  # type: ignore[method-assign, assignment]

    undo = seed_undo.Made.undo

    def recording(self: seed_undo.Made, registry: CellRegistry) -> str:
        found = {
            "workers_alive": spawned(os.getpid()),
            "rows": {str(path): _rows(path) for path in self.files},
        }
        Path(os.environ["SEED_REPORT"]).write_text(json.dumps(found))
        return undo(self, registry)

    seed_undo.Made.undo = recording  # type: ignore[method-assign]


if __name__ == "__main__":
    _install()
    from cellsight.cli import main

    main()
