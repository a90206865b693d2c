"""A missing or empty path is an error naming it, and nothing is created in its place:
a registered cell's SQLite file that was moved (or mistyped) does not become an empty
cell when a command reads it, and an empty data directory is not the working
directory. Run as the operator runs it: a subprocess of the installed entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellsight.cells.mappings import CellRegistry
from cellsight.cli.errors import RUNTIME, USAGE
from cellsight.settings import load_settings


def cellsight(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    return subprocess.run(
        [sys.executable, "-m", "cellsight", *args],
        capture_output=True,
        text=True,
        timeout=120,
        # Wide enough that a table cell holding the path does not wrap it.
        env={**clean, "COLUMNS": "1000", **(env or {})},
        cwd=cwd,
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    err = result.stderr.strip()
    assert result.returncode == code, (result.returncode, result.stdout, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture
def moved_cell(tmp_path: Path) -> tuple[Path, Path]:
    """A data directory whose registered cell ``c1`` has lost its SQLite file."""
    data = tmp_path / "data"
    db = tmp_path / "c1.db"
    registry = CellRegistry.from_settings(load_settings(data_dir=data))
    try:
        registry.add_cell("c1", f"sqlite:///{db}")
    finally:
        registry.close()
    for file in tmp_path.glob("c1.db*"):  # with its -wal and -shm, if any
        file.unlink()
    return data, db


BOOT = ["ops", "boot", "--name", "x", "--flavor", "m1.small", "--project", "p", "--user", "u"]


@pytest.mark.parametrize(
    ("command", "code"),
    [
        # Reports: the cell's row or line names the missing file.
        (["index", "verify"], RUNTIME),
        (["index", "status"], 0),
        (["cells", "list", "--counts"], 0),
        (["query", "instance"], 0),  # the fan-out skips the cell and says why
        # Failures: one line naming the missing file.
        (["index", "sync"], RUNTIME),
        (["cells", "add-host", "--cell", "c1", "--host", "h1"], RUNTIME),
        (BOOT, RUNTIME),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_a_missing_sqlite_cell_file_is_named_and_not_created(
    moved_cell: tuple[Path, Path], command: list[str], code: int
) -> None:
    data, db = moved_cell
    result = cellsight(data.parent, "--data-dir", str(data), *command)
    text = result.stdout + result.stderr
    assert result.returncode == code, text
    assert f"SQLite database file {str(db)!r} does not exist" in text, text
    assert "no such table" not in text and "Traceback" not in text, text
    if command in (BOOT, ["cells", "add-host", "--cell", "c1", "--host", "h1"]):
        one_line_error(result, RUNTIME, str(db))
    assert not list(db.parent.glob("c1.db*")), "a command created the missing cell file"


def test_an_empty_data_dir_option_is_a_usage_error(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = cellsight(cwd, "--data-dir", "", "cells", "list")
    one_line_error(result, USAGE, "'--data-dir'", "must not be empty")
    assert not list(cwd.iterdir()), "written into the working directory"


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_data_dir_setting_is_refused(tmp_path: Path, value: str) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = cellsight(cwd, "cells", "list", env={"CELLSIGHT_DATA_DIR": value})
    one_line_error(result, USAGE, "data_dir", "CELLSIGHT_DATA_DIR", "must not be empty")
    assert not list(cwd.iterdir()), "written into the working directory"


@pytest.mark.parametrize("below", ["", "inner"])
def test_a_data_dir_that_is_a_file_is_a_usage_error(tmp_path: Path, below: str) -> None:
    """An adversarial probe: a file as the data directory (or on its way) failed at the
    first directory made there, exit 1 with the OS's "File exists" or "Not a directory"."""
    file = tmp_path / "plain.txt"
    file.write_text("not a directory")
    data = file / below if below else file
    result = cellsight(tmp_path, "--data-dir", str(data), "index", "sync")
    one_line_error(result, USAGE, "'--data-dir'", f"{file} is a file, not a directory")
    by_env = cellsight(tmp_path, "cells", "list", env={"CELLSIGHT_DATA_DIR": str(data)})
    one_line_error(by_env, USAGE, "data_dir", "CELLSIGHT_DATA_DIR", "is a file, not a directory")


def test_an_api_database_in_a_missing_directory_is_a_bad_setting(tmp_path: Path) -> None:
    """It was created, directories and all: a typo in the setting became a new, empty
    registry ("no cells registered") instead of an error."""
    target = tmp_path / "typo" / "deeper" / "api.db"
    env = {"CELLSIGHT_API_DB_URL": f"sqlite:///{target}"}
    result = cellsight(tmp_path, "--data-dir", str(tmp_path / "data"), "cells", "list", env=env)
    missing = f"directory {target.parent} does not exist"
    one_line_error(result, USAGE, "CELLSIGHT_API_DB_URL", missing)
    assert not (tmp_path / "typo").exists()
    # In a directory that is there, it is made on first use, as before.
    target.parent.mkdir(parents=True)
    made = cellsight(tmp_path, "--data-dir", str(tmp_path / "data"), "cells", "list", env=env)
    assert made.returncode == 0, made.stderr
    assert target.is_file()


def test_seed_asks_before_making_a_db_url_directory_as_cells_add_does(tmp_path: Path) -> None:
    target = tmp_path / "typo" / "cell.db"
    args = ["--data-dir", str(tmp_path / "data"), "cells", "seed", "--instances", "3"]
    refused = cellsight(tmp_path, *args, "--db-url", f"sqlite:///{target}")
    missing = f"directory {target.parent} does not exist"
    one_line_error(refused, USAGE, "--db-url", missing, "--create")
    assert not target.parent.exists()
    listed = cellsight(tmp_path, "--data-dir", str(tmp_path / "data"), "cells", "list")
    assert "cell1" not in listed.stdout  # nothing registered either
    made = cellsight(tmp_path, *args, "--db-url", f"sqlite:///{target}", "--create")
    assert made.returncode == 0, made.stderr
    assert target.is_file()


UUID = "2f4b0f6c-0d7a-4a43-9d0e-5c2a51a0b8a1"


@pytest.mark.parametrize(
    "command",
    [
        ["cells", "list"],
        ["cells", "disable", "c1"],
        ["cells", "remove", "c1"],
        ["ops", "show", UUID],
        ["outbox", "status"],
        ["outbox", "relay"],
        ["index", "status"],
        ["index", "sync"],
        ["index", "verify", "--repair"],
        ["index", "get", UUID],
        ["index", "purge"],
        ["dlq", "list"],
        ["query", "instance"],
    ],
    ids=" ".join,
)
def test_a_missing_data_dir_is_named_not_made(tmp_path: Path, command: list[str]) -> None:
    """A review: a mistyped --data-dir was made, empty, and every command answered
    "nothing" (no cells, no documents, no dead letters) as if all were well."""
    typo = tmp_path / "typo"
    result = cellsight(tmp_path, "--data-dir", str(typo), *command)
    one_line_error(result, USAGE, f"no data directory at {typo}", "cellsight cells add")
    assert not typo.exists(), "the command made the mistyped data directory"


def test_cells_add_makes_the_data_dir_and_the_rest_read_it(tmp_path: Path) -> None:
    data = tmp_path / "new"
    added = cellsight(
        tmp_path, "--data-dir", str(data), "cells", "add", "--name", "c1",
        "--db-url", f"sqlite:///{tmp_path / 'c1.db'}", "--create",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = cellsight(tmp_path, "--data-dir", str(data), "cells", "list")
    assert listed.returncode == 0, listed.stderr
    assert "c1" in listed.stdout


def test_with_the_api_database_elsewhere_sync_makes_the_data_dir_and_producers_refuse(
    tmp_path: Path,
) -> None:
    """A review: with CELLSIGHT_API_DB_URL set, the first ``index sync`` of a new host
    was refused (it makes the index), while ``ops`` and ``outbox relay`` made a mistyped
    directory's bus and relayed the outboxes into it, where no indexer reads."""
    api_db = tmp_path / "api.db"
    env = {"CELLSIGHT_API_DB_URL": f"sqlite:///{api_db}"}
    data = tmp_path / "data"
    added = cellsight(
        tmp_path, "--data-dir", str(data), "cells", "add", "--name", "c1",
        "--db-url", f"sqlite:///{tmp_path / 'c1.db'}", env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    typo = tmp_path / "typo"
    for command in (["outbox", "relay"], BOOT):
        refused = cellsight(tmp_path, "--data-dir", str(typo), *command, env=env)
        one_line_error(refused, USAGE, f"no data directory at {typo}", "where the bus would be")
        assert not typo.exists(), command
    synced = cellsight(tmp_path, "--data-dir", str(typo), "index", "sync", env=env)
    assert synced.returncode == 0, synced.stderr
    assert (typo / "index.db").exists()
