"""Two things an operator's terminal shows that it should not: an ``error: Broken pipe``
when a reader stops early (``cellsight index get UUID | head``), and the search
clients' WARNING line for every 404 the code expects, with logs off by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellsight.cli.errors import RUNTIME
from tests.cli.test_cli_errors import cellsight

CLOSED_PIPE = 141  # 128 + SIGPIPE, as the README's exit codes say


def closed_pipe_run(
    cwd: Path, argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with stdout a pipe whose reader is already gone."""
    read, write = os.pipe()
    os.close(read)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    try:
        return subprocess.run(
            argv,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**clean, **(env or {})},
            cwd=cwd,
        )
    finally:
        os.close(write)


def cellsight_argv(data: Path, *args: str) -> list[str]:
    data.mkdir(parents=True, exist_ok=True)  # a missing one: test_cli_missing_paths
    return [sys.executable, "-m", "cellsight", "--data-dir", str(data), *args]


@pytest.mark.parametrize(
    "command",
    [
        ["cells", "list"],  # printed by rich as it goes
        ["index", "status", "--json"],  # print(): buffered until exit
        # The help, printed by Typer's own console before any command runs: Rich ended
        # it with exit 1 (found from outside: ``cellsight --help | head -1``).
        ["--help"],
        ["cells", "--help"],
        ["cells", "add", "--help"],
    ],
)
def test_a_closed_stdout_ends_quietly(tmp_path: Path, command: list[str]) -> None:
    result = closed_pipe_run(tmp_path, cellsight_argv(tmp_path / "d", *command))
    assert result.stderr == ""
    assert result.returncode == CLOSED_PIPE


def test_index_get_into_a_closed_pipe(tmp_path: Path) -> None:
    data = tmp_path / "d"
    seeded = cellsight(data, "cells", "seed", "--cells", "1", "--instances", "3")
    assert seeded.returncode == 0, seeded.stderr
    synced = cellsight(data, "index", "sync", "--type", "instance")
    assert synced.returncode == 0, synced.stderr
    listed = cellsight(data, "query", "instance", "uuid", "--no-headers")
    uuid = listed.stdout.split()[0]
    result = closed_pipe_run(tmp_path, cellsight_argv(data, "index", "get", uuid))
    assert (result.returncode, result.stderr) == (CLOSED_PIPE, "")
    shown = cellsight(data, "index", "get", uuid)  # the document is there to print
    assert shown.returncode == 0 and uuid in shown.stdout


# A command whose print() fills the pipe's buffer mid-command, and one that meets a
# broken pipe that is not stdout's (a bus or engine connection): that one is a failure.
SCRIPT = """
import sys
from cellsight.cli import app, main

@app.command("flood")
def flood() -> None:
    for _ in range(10_000):
        print("x" * 100)

@app.command("peer-gone")
def peer_gone() -> None:
    raise BrokenPipeError(32, "Broken pipe")

sys.argv = ["cellsight", sys.argv[1]]
main()
"""


def test_a_closed_stdout_mid_command_ends_quietly(tmp_path: Path) -> None:
    result = closed_pipe_run(tmp_path, [sys.executable, "-c", SCRIPT, "flood"])
    assert (result.returncode, result.stderr) == (CLOSED_PIPE, "")


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "peer-gone"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == RUNTIME
    assert result.stderr.strip() == "error: Broken pipe"


@pytest.mark.services
def test_search_client_warnings_only_with_vv_or_debug(tmp_path: Path, osmem_url: str) -> None:
    env = {"CELLSIGHT_SEARCH_URL": osmem_url}
    quiet = cellsight(tmp_path / "d", "index", "status", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "opensearch" not in quiet.stderr and "404" not in quiet.stderr, quiet.stderr
    # -v is for Cellsight's own INFO logs: the clients' warnings and tracebacks, one per
    # failed request, buried them (4,089 lines in a probe's 71 s engine freeze).
    informed = cellsight(tmp_path / "d", "-v", "index", "status", env=env)
    assert informed.returncode == 0, informed.stderr
    assert "WARNING opensearch" not in informed.stderr, informed.stderr
    for flag in ("-vv", "--debug"):
        told = cellsight(tmp_path / "d", flag, "index", "status", env=env)
        assert told.returncode == 0, told.stderr
        assert "WARNING opensearch GET" in told.stderr and "status:404" in told.stderr


def test_a_status_line_into_a_pipe_stays_one_line() -> None:
    """A probe: under a service manager (stdout a pipe) Rich wrapped the indexer's status
    line at 80 columns, and one message became three journal entries."""
    line = "indexer[0]: opensearch engine, queue " + "q" * 120 + " on amqp://127.0.0.1:5672//"
    code = (
        "from cellsight.cli.context import console, err_console\n"
        f"console.print({line!r}, highlight=False)\n"
        f"err_console.print({line!r}, highlight=False)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == line + "\n"
    assert done.stderr == line + "\n"


def test_a_table_into_a_pipe_is_whole(tmp_path: Path) -> None:
    """An operator probe: ``cells list | grep`` found uuids and database URLs cut short
    (Rich fits a table into 80 columns where stdout is no terminal). Piped, a table is
    printed whole; ``--json`` gives the same cells to a script. A name that looks like
    Rich markup is printed as it is."""
    data = tmp_path / "d"
    name = "[bold]cell-with-a-name-long-enough-to-be-cut-in-eighty-columns"
    url = f"sqlite:///{tmp_path}/a-directory-name-long-enough-to-be-cut/cell.db"
    added = cellsight(data, "cells", "add", "--name", name, "--db-url", url, "--create")
    assert added.returncode == 0, added.stderr
    uuid = added.stdout.split()[-2]
    listed = cellsight(data, "cells", "list", "--counts")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if uuid in line)
    assert name in row and "/a-directory-name-long-enough-to-be-cut/cell.db" in row
    status = cellsight(data, "index", "status")
    assert status.returncode == 0, status.stderr
    assert name in status.stdout
    as_json = cellsight(data, "cells", "list", "--counts", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == [
        {"name": name, "uuid": uuid, "database": url.replace("sqlite:", "sqlite+pysqlite:"),
         "disabled": False, "instances": 0}
    ]  # fmt: skip
