"""``index verify``'s report of a cell whose comparison failed: its table row says
"error" (not rows and documents of 0), the reason is given, the verdict counts only the
cells compared, and its documents are not taken for documents of no registered cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cellsight.cells.mappings import CellRegistry
from cellsight.cli import _register, app
from cellsight.indexer.verify_report import CellDrift, VerifyReport
from cellsight.settings import Settings
from tests.support.outages import lose
from tests.support.sync_world import seeded_settings

runner = CliRunner()


@pytest.fixture
def one_cell_lost(tmp_path: Path) -> Settings:
    """Two cells of 10 instances, synced; then cell2's database file is gone."""
    settings = seeded_settings(tmp_path / "data")
    _register()
    assert cli(settings, "sync").exit_code == 0
    registry = CellRegistry.from_settings(settings)
    lose(registry, registry.get_cell("cell2"))
    registry.close()
    return settings


def cli(settings: Settings, *args: str) -> Any:
    return runner.invoke(app, ["--data-dir", str(settings.data_dir), "index", *args])


def row_of(table: str, cell: str) -> list[str]:
    (line,) = [line for line in table.splitlines() if f"│ {cell} " in line]
    return [part.strip() for part in line.strip("│ ").split("│")]


def test_a_failed_cell_is_shown_failed_not_empty(one_cell_lost: Settings) -> None:
    result = cli(one_cell_lost, "verify", "--type", "instance")
    assert result.exit_code == 1, result.output
    assert row_of(result.stdout, "cell2") == ["cell2", "error", *["-"] * 7]
    assert row_of(result.stdout, "cell1")[:3] == ["cell1", "10", "10"]  # compared as ever
    reason = result.stderr.replace("\n", "")  # wrapped to the terminal's width
    assert "cell2: not compared: DatabaseMissing: " in reason and "cell2.db" in reason
    assert "instance: no drift in 1 of 2 cells; failed: cell2" in result.stdout
    assert "no registered cell" not in result.stdout  # cell2's documents are cell2's


def test_the_json_report_names_the_failure(one_cell_lost: Settings) -> None:
    result = cli(one_cell_lost, "verify", "--type", "instance", "--json")
    assert result.exit_code == 1, result.output
    (report,) = json.loads(result.stdout)["reports"]
    cells = {c["name"]: c for c in report["cells"]}
    assert cells["cell1"]["failed"] is None and cells["cell1"]["rows"] == 10
    assert cells["cell2"]["failed"].startswith("DatabaseMissing: ")
    assert cells["cell2"]["errors"] == [cells["cell2"]["failed"]]
    assert report["unattributed"] is None  # not known while a cell's documents are not


def test_repair_shows_the_failed_cell_alike(one_cell_lost: Settings) -> None:
    result = cli(one_cell_lost, "verify", "--type", "instance", "--repair")
    assert result.exit_code == 1, result.output
    assert row_of(result.stdout, "cell2") == ["cell2", "error", *["-"] * 7]
    assert row_of(result.stdout, "cell1")[-1] == "0"  # repaired: nothing to repair


def test_a_cell_that_failed_after_repairs_says_what_was_repaired(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A database-fault probe: a ``verify --repair`` that failed partway said the cell
    was "not compared", though the documents it had repaired stayed repaired."""
    from cellsight.cli.index_sync_cmd import _print_report

    failed = "DatabaseUnavailable: database 'x' is unavailable: gone"
    partly = CellDrift("u1", "cell1", missing=3, repaired=3, failed=failed, errors=[failed])
    untouched = CellDrift("u2", "cell2", failed=failed, errors=[failed])
    report = VerifyReport("instance", "alias", True, "now", cells=[partly, untouched])
    _print_report(report)
    out, err = capsys.readouterr()
    assert row_of(out, "cell1") == ["cell1", "error", *["-"] * 6, "3"]
    assert row_of(out, "cell2") == ["cell2", "error", *["-"] * 7]
    err = err.replace("\n", "")
    assert f"cell1: compared partly (3 repaired), then failed: {failed}" in err
    assert f"cell2: not compared: {failed}" in err


def test_the_verdict_keeps_a_failed_cells_repairs_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sync probe: "drift 1149, 1,161 repaired": the repairs counted a failed cell's,
    the drift only the compared cells'."""
    from cellsight.cli.index_sync_cmd import _print_report

    failed = "EngineUnavailable: read timeout"
    compared = CellDrift("u1", "cell1", rows=9, documents=9, stale=4, repaired=4)
    partly = CellDrift("u2", "cell2", repaired=330, failed=failed, errors=[failed])
    _print_report(VerifyReport("instance", "alias", True, "now", cells=[compared, partly]))
    out = capsys.readouterr().out.replace("\n", " ")
    assert "instance: drift 4, 4 repaired in 1 of 2 cells; failed: cell2" in out, out
    assert "(330 repaired there before failing)" in out, out
