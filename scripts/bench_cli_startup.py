"""How long ``cellsight --help`` and a light command take to start, against same-run
baselines (a bare interpreter, and ``import typer``). Prints JSON.

    .venv/bin/python scripts/bench_cli_startup.py [--runs 7]

The figure of record is the median wall time of ``cellsight --help``; the target is
0.3 s. ``python -X importtime -m cellsight --help`` shows where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def timed(args: list[str], runs: int) -> tuple[float, float]:
    """Median wall seconds and the child's median CPU seconds (which another process on
    the machine disturbs far less than the wall clock)."""
    times, cpus = [], []
    for _ in range(runs):
        before, start = os.times(), time.perf_counter()
        subprocess.run(args, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
        after = os.times()
        user = after.children_user - before.children_user
        cpus.append(user + after.children_system - before.children_system)
    return statistics.median(times), statistics.median(cpus)


def wall(args: list[str], runs: int) -> float:
    return timed(args, runs)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    py = sys.executable
    bare = wall([py, "-c", "pass"], runs)
    typer = wall([py, "-c", "import typer"], runs)  # measured in this order, as before
    help_wall, help_cpu = timed([py, "-m", "cellsight", "--help"], runs)
    results = {
        "python_bare_s": bare,
        "import_typer_s": typer,
        "cellsight_help_s": help_wall,
        "cellsight_index_help_s": wall([py, "-m", "cellsight", "index", "sync", "--help"], runs),
    }
    results["cellsight_help_cpu_s"] = help_cpu
    results["help_over_typer"] = round(results["cellsight_help_s"] / results["import_typer_s"], 2)
    results["target_s"] = 0.3
    results["runs"] = runs
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}))


if __name__ == "__main__":
    main()
