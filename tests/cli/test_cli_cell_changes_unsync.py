"""Found from outside: a cell registered or seeded after (or during) a full sync was
missing from an index still marked synced, so the API listed from the index without
that cell's instances where the fan-out listed them. A new cell holding instances
(``cells add`` of an existing database, ``cells seed`` without ``--notify``) now marks
the serving indexes unsynced, as ``cells remove`` did, and holds the maintenance locks
while it is registered (a sync that listed the cells before would mark its index
synced afterwards)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cellsight.cli import app
from cellsight.clients import build_engine
from cellsight.indexer.lock import MaintenanceLock
from cellsight.settings import load_settings
from tests.cli.test_cli_errors import cellsight


def _synced(data: Path) -> list[str]:
    status = cellsight(data, "index", "status", env={"COLUMNS": "400"})  # no wrapping
    assert status.returncode == 0, status.stderr
    return [line for line in status.stdout.splitlines() if line.startswith("synced:")]


def _seed_and_sync(data: Path) -> None:
    for args in (
        ("cells", "seed", "--instances", "5"),
        ("index", "sync"),
        ("index", "sync", "--type", "node"),
    ):
        done = cellsight(data, *args)
        assert done.returncode == 0, done.stderr
    assert all(line.startswith("synced: yes") for line in _synced(data))


def test_seeding_a_cell_after_a_sync_marks_the_index_unsynced(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _seed_and_sync(data)
    seeded = cellsight(data, "cells", "seed", "--instances", "5")
    assert seeded.returncode == 0, seeded.stderr
    for line in _synced(data):
        assert line.startswith("synced: no (1 cell seeded without notifications"), line
    assert cellsight(data, "index", "sync").returncode == 0
    assert _synced(data)[0].startswith("synced: yes")


def test_adding_a_cell_marks_the_index_unsynced_only_if_it_holds_instances(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _seed_and_sync(data)
    empty = cellsight(
        data, "cells", "add", "--name", "empty", "--db-url", f"sqlite:///{tmp_path / 'e.db'}"
    )
    assert empty.returncode == 0, empty.stderr
    assert all(line.startswith("synced: yes") for line in _synced(data))
    # A copy of a cell's database with its instances, registered as another cell.
    shutil.copy(data / "cells" / "cell1.db", tmp_path / "full.db")
    full = cellsight(
        data, "cells", "add", "--name", "full", "--db-url", f"sqlite:///{tmp_path / 'full.db'}"
    )
    assert full.returncode == 0, full.stderr
    for line in _synced(data):
        assert line.startswith("synced: no (cell full ("), line
        assert "added with 5 instances" in line


def test_a_cell_is_not_registered_while_a_sync_holds_the_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _seed_and_sync(data)
    engine = build_engine(load_settings(data_dir=data))
    try:
        with MaintenanceLock(engine, "instance", "sync"):
            added = cellsight(
                data, "cells", "add", "--name", "late", "--db-url", f"sqlite:///{tmp_path / 'l.db'}"
            )
            seeded = cellsight(data, "cells", "seed", "--instances", "5")
    finally:
        engine.close()
    for refused in (added, seeded):
        assert refused.returncode == 3, refused.stderr
        assert "is running" in refused.stderr
    listed = cellsight(data, "cells", "list")
    assert "late" not in listed.stdout and "cell2" not in listed.stdout


def _interrupted_at(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
    """Ctrl-C (or SIGTERM, raised as it) landing as ``module.name`` is entered."""

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, interrupted)


def test_an_add_interrupted_before_the_index_is_marked_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt probe: `cells add` of a database with instances, interrupted between
    its registration and the unsynced mark, left the cell registered and the index
    marked synced without its instances (exit 130, "cleaned up")."""
    from cellsight.cli import index_marks

    data = tmp_path / "data"
    _seed_and_sync(data)
    shutil.copy(data / "cells" / "cell1.db", tmp_path / "full.db")
    _interrupted_at(monkeypatch, index_marks, "unmark_all")
    url = f"sqlite:///{tmp_path / 'full.db'}"
    added = CliRunner().invoke(
        app, ["--data-dir", str(data), "cells", "add", "--name", "full", "--db-url", url]
    )
    assert added.exit_code == 130, added.output
    monkeypatch.undo()
    assert "full" not in cellsight(data, "cells", "list").stdout
    assert all(line.startswith("synced: yes") for line in _synced(data))


def test_a_seed_interrupted_after_its_cells_were_made_left_the_index_unsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same probe: `cells seed` interrupted once its cells were seeded, before the
    mark, left them registered and the index marked synced. The index is marked first."""
    from cellsight.cells import seed as seeding

    data = tmp_path / "data"
    _seed_and_sync(data)
    seeded = seeding.seed

    def seeded_then_interrupted(*args: object, **kwargs: object) -> object:
        seeded(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    monkeypatch.setattr(seeding, "seed", seeded_then_interrupted)
    interrupted = CliRunner().invoke(
        app, ["--data-dir", str(data), "cells", "seed", "--instances", "5"]
    )
    assert interrupted.exit_code == 130, interrupted.output
    monkeypatch.undo()
    assert "cell2" in cellsight(data, "cells", "list").stdout
    for line in _synced(data):
        assert line.startswith("synced: no (1 cell seeded without notifications"), line


def test_a_removal_interrupted_as_it_commits_leaves_the_index_unsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: `cells remove` interrupted just after its removal committed left the
    index marked synced, serving the removed cell's documents. It is marked first."""
    from cellsight.cells import cell_removal

    data = tmp_path / "data"
    _seed_and_sync(data)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    for args in (
        ("cells", "add", "--name", "empty", "--db-url", url),
        ("cells", "disable", "empty"),
    ):
        assert cellsight(data, *args).returncode == 0
    assert all(line.startswith("synced: yes") for line in _synced(data))
    removed = cell_removal._delete

    def removed_then_interrupted(*args: object, **kwargs: object) -> None:
        removed(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    monkeypatch.setattr(cell_removal, "_delete", removed_then_interrupted)
    interrupted = CliRunner().invoke(app, ["--data-dir", str(data), "cells", "remove", "empty"])
    assert interrupted.exit_code == 130, interrupted.output
    monkeypatch.undo()
    assert "empty" not in cellsight(data, "cells", "list").stdout
    for line in _synced(data):
        assert line.startswith("synced: no (cell empty ("), line


@pytest.mark.parametrize("given_uuid", [False, True])
def test_an_add_interrupted_as_its_registration_returns_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given_uuid: bool
) -> None:
    """An interrupt in the instant `add_cell` returns, its registration committed: the
    undo missed it when `--uuid` was given (it undid only uuids it had made)."""
    from cellsight.cells.mappings import CellRegistry

    data = tmp_path / "data"
    _seed_and_sync(data)
    real = CellRegistry.add_cell

    def registered_then_interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(CellRegistry, "add_cell", registered_then_interrupted)
    url = f"sqlite:///{tmp_path / 'new.db'}"
    uuid_ = ["--uuid", "8f9e6a61-3a0b-4b39-9d5e-5c1b8a2f7e10"] if given_uuid else []
    added = CliRunner().invoke(
        app, ["--data-dir", str(data), "cells", "add", "--name", "new", "--db-url", url, *uuid_]
    )
    assert added.exit_code == 130, added.output
    monkeypatch.undo()
    assert "new" not in cellsight(data, "cells", "list").stdout
    again = cellsight(data, "cells", "add", "--name", "new", "--db-url", url, *uuid_)
    assert again.returncode == 0, again.stderr


def test_an_interrupted_add_never_undoes_another_commands_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: the undo deleted by uuid alone, so a `cells add --uuid U` interrupted
    in its slow connect deleted the cell another command registered as U meanwhile."""
    from cellsight.cells.mappings import CellRegistry

    data = tmp_path / "data"
    _seed_and_sync(data)
    given = "8f9e6a61-3a0b-4b39-9d5e-5c1b8a2f7e10"
    real = CellRegistry.add_cell

    def another_registered_meanwhile(self: CellRegistry, *args: Any, **kwargs: Any) -> Any:
        real(self, "other", f"sqlite:///{tmp_path / 'other.db'}", uuid=given)
        raise KeyboardInterrupt  # this command's own connect, interrupted

    monkeypatch.setattr(CellRegistry, "add_cell", another_registered_meanwhile)
    url = f"sqlite:///{tmp_path / 'new.db'}"
    added = CliRunner().invoke(
        app, ["--data-dir", str(data), "cells", "add", "--name", "new", "--db-url", url,
              "--uuid", given]
    )  # fmt: skip
    assert added.exit_code == 130, added.output
    monkeypatch.undo()
    listed = cellsight(data, "cells", "list", "--json")
    assert [(c["name"], c["uuid"]) for c in json.loads(listed.stdout) if c["uuid"] == given] == [
        ("other", given)
    ]
