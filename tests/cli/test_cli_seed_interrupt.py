"""A ``cells seed`` (or the demo's first-run seed) that is interrupted or fails leaves
no cell it made, so a rerun starts clean; run as the operator runs it, the signal
injected at a chosen progress report (``tests.support.seed_interrupt``). Found by an
adversarial probe: SIGTERM killed the seed with its cells registered half-loaded (and
the demo then reused them), and a Ctrl-C sent to the seed's parent process alone let
every worker load its whole cell before the clean-up."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from cellsight.cli.errors import INTERRUPTED, RUNTIME, USAGE
from tests.cli.test_cli_errors import assert_one_line_error, cellsight, closed_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def interrupted(
    data: Path, *args: str, signal: str, after: int, to_group: bool = False, cpus: int = 0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``cellsight --data-dir DATA ARGS``, sending ``signal`` after ``after`` rows."""
    report = data.parent / "undo.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    env = {
        **clean,
        "SEED_SIGNAL": signal,
        "SEED_AFTER": str(after),
        "SEED_TO_GROUP": "1" if to_group else "0",
        "SEED_REPORT": str(report),
        **({"SEED_CPUS": str(cpus)} if cpus else {}),
    }
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.seed_interrupt", "--data-dir", str(data), *args],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
        start_new_session=True,  # a signal to its group reaches it and its workers only
    )  # fmt: skip
    return result, (json.loads(report.read_text()) if report.exists() else {})


def registered(data: Path) -> tuple[int, int]:
    """(cells, instance mappings) in the data directory's API database."""
    with sqlite3.connect(data / "api.db") as conn:
        cells = conn.execute("SELECT count(*) FROM cell_mappings").fetchone()[0]
        mapped = conn.execute("SELECT count(*) FROM instance_mappings").fetchone()[0]
    return int(cells), int(mapped)


def left_nothing(data: Path, result: subprocess.CompletedProcess[str], code: int) -> None:
    assert_one_line_error(result, code)  # no worker's traceback either
    assert registered(data) == (0, 0)
    assert sorted(p.name for p in (data / "cells").iterdir()) == []


def test_sigterm_during_a_seed_undoes_it_as_ctrl_c_does(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed = ("cells", "seed", "--cells", "2", "--instances", "400", "--chunk-size", "50")
    result, _ = interrupted(data, *seed, signal="TERM", after=450)  # in the second cell
    assert result.returncode == INTERRUPTED, (result.returncode, result.stderr)
    # What became of its cells, not a bare "interrupted" (a README probe).
    said = "seed interrupted: the cells it made (cell1, cell2) are unregistered"
    assert said in " ".join(result.stderr.split())
    left_nothing(data, result, INTERRUPTED)
    again = cellsight(data, *seed)
    assert again.returncode == 0, again.stderr
    assert "seeded 2 cells (cell1, cell2)" in again.stdout
    assert registered(data) == (2, 800)


def test_ctrl_c_to_the_parent_alone_stops_the_workers_before_the_undo(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # 20,000 per cell: loaded in parallel worker processes.
    seed = ("cells", "seed", "--cells", "2", "--instances", "20000", "--chunk-size", "500")
    result, found = interrupted(data, *seed, signal="INT", after=500)
    left_nothing(data, result, INTERRUPTED)
    # At the undo: no worker left to write, and none had gone on to load its whole cell.
    assert found["workers_alive"] == []
    assert len(found["rows"]) == 2
    assert all(rows is None or rows < 20_000 for rows in found["rows"].values()), found


def test_ctrl_c_in_a_terminal_stops_parent_and_workers_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed = ("cells", "seed", "--cells", "2", "--instances", "20000", "--chunk-size", "500")
    result, found = interrupted(data, *seed, signal="INT", after=500, to_group=True)
    left_nothing(data, result, INTERRUPTED)
    assert found["workers_alive"] == []


def test_a_demo_stopped_while_seeding_seeds_again_on_the_next_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    demo = ("demo", "--no-serve", "--port", "0", "--cells", "2", "--instances", "300")
    first, _ = interrupted(data, *demo, signal="TERM", after=400)
    assert first.returncode == INTERRUPTED, (first.returncode, first.stderr)
    assert "seed interrupted: the cells it made (cell1, cell2)" in " ".join(first.stderr.split())
    assert registered(data) == (0, 0)
    again = cellsight(data, *demo)
    assert again.returncode == 0, again.stderr
    assert "reusing" not in again.stdout and "seeded 2 cells (cell1, cell2)" in again.stdout


def test_a_seed_whose_second_url_fails_registers_no_cell(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = tmp_path / "first.db"
    bad = cellsight(
        data, "cells", "seed", "--cells", "2", "--instances", "1",
        "--db-url", f"sqlite:///{first}", "--db-url", "foo",
    )  # fmt: skip
    assert_one_line_error(bad, USAGE, "'foo'")
    down = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/x"
    unreachable = cellsight(
        data, "cells", "seed", "--cells", "2", "--instances", "1",
        "--db-url", f"sqlite:///{first}", "--db-url", down,
    )  # fmt: skip
    assert_one_line_error(unreachable, RUNTIME, "unavailable")
    assert registered(data) == (0, 0)
    assert not first.exists()


def _gone(pid: int) -> bool:
    """Exited: no process, or a zombie left to a parent that does not reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_a_seed_killed_outright_takes_its_workers_with_it(tmp_path: Path) -> None:
    """An adversarial probe: after a SIGKILL of ``cells seed``, a worker waiting for its
    next job (its cell done) blocked on the pool's queue for good, 70 MB each."""
    data = tmp_path / "data"
    # Three cells on two workers: by the third cell's rows, one worker has no job left.
    seed = ("cells", "seed", "--cells", "3", "--instances", "20000", "--chunk-size", "500")
    result, found = interrupted(data, *seed, signal="KILL", after=45_000, cpus=2)
    assert result.returncode == -9, (result.returncode, result.stderr)
    assert len(found["workers"]) == 2
    wait_for(lambda: all(_gone(pid) for pid in found["workers"]), timeout=30,
             what="the workers to exit with their parent")  # fmt: skip
