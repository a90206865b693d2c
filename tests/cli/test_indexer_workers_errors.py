"""``cellsight indexer --workers N`` whose writer process dies: the worker says so in one
line (which worker, what died, its exit code), not with a traceback, and the indexer
exits 1 as before. Run as the operator runs it: a subprocess of the entry point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cellsight.cli.errors import RUNTIME
from tests.support.waiting import spawned, wait_for


def writers(supervisor: int) -> list[int]:
    """The writer processes of the supervisor's workers."""
    return [writer for worker in spawned(supervisor) for writer in spawned(worker)]


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` past their start: a writer starts its watch thread once its
    engine is built, just before it tells its worker it is ready."""
    return [pid for pid in pids if len(list(Path(f"/proc/{pid}/task").glob("*"))) > 1]


def _stopped_after(tmp_path: Path, kill: Callable[[int], int]) -> tuple[int, str, str]:
    """``cellsight indexer --workers 2`` on its own data directory; once both workers'
    writers run, ``kill(supervisor pid)`` picks a process to SIGKILL; returns the
    indexer's exit code, stdout and stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    data = str(tmp_path / "data")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellsight", "--data-dir", data, "indexer", "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean,
        cwd=tmp_path,
        start_new_session=True,  # its own process group: cleaned up whole if the test fails
    )
    try:
        # Running, not still starting: a worker killed while its writer read what to run
        # left that writer's bootstrap traceback (EOFError) on the shared stderr.
        wait_for(lambda: len(running(writers(proc.pid))) == 2, 90, "both workers' writers")
        os.kill(kill(proc.pid), signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode, out, err


def test_a_dead_writer_is_one_line_naming_its_worker(tmp_path: Path) -> None:
    code, out, err = _stopped_after(tmp_path, lambda supervisor: writers(supervisor)[0])
    assert code == RUNTIME, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    (line,) = lines
    assert line.startswith("error: indexer["), line
    assert line.endswith("]: writer process exited (code -9)"), line
    assert "stopped on its own; stopping the others" in out  # the supervisor, as before


def test_a_killed_worker_is_one_line_naming_it(tmp_path: Path) -> None:
    """An adversarial probe: a worker killed with SIGKILL left the indexer exiting 1
    with nothing on stderr (a worker that fails says why itself; a killed one cannot)."""
    code, out, err = _stopped_after(tmp_path, lambda supervisor: spawned(supervisor)[0])
    assert code == RUNTIME, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: indexer["), lines[0]
    assert lines[0].endswith("]: worker process killed by SIGKILL"), lines[0]
