"""``cellsight index sync|status|verify`` from the command line, and the indexer's
periodic anti-entropy thread."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cellsight.cells.mappings import CellRegistry
from cellsight.cli import _register, app
from cellsight.clients import build_engine
from cellsight.indexer.antientropy import start_periodic_verify
from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.index_roles import LAST_VERIFY, layout, new_index_name
from cellsight.indexer.lock import MaintenanceLock
from cellsight.settings import Settings, load_settings
from tests.support.sync_world import seeded_settings

runner = CliRunner()


@pytest.fixture
def seeded(tmp_path: Path) -> Settings:
    settings = seeded_settings(tmp_path / "data", instances_per_cell=40)
    _register()
    return settings


def cli(settings: Settings, *args: str) -> Any:
    return runner.invoke(app, ["--data-dir", str(settings.data_dir), "index", *args])


def test_sync_status_verify(seeded: Settings) -> None:
    done = cli(seeded, "sync", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["ok"] and report["rows"] == 80 and report["mode"] == "full"
    assert {c["name"]: c["documents"] for c in report["cells"]} == {"cell1": 40, "cell2": 40}
    assert report["peak_rss_mb"]["sync"] > 0
    assert cli(seeded, "sync", "--type", "node").exit_code == 0

    status = cli(seeded, "status", "--json")
    assert status.exit_code == 0, status.output
    by_type = {s["resource"]: s for s in json.loads(status.stdout)}
    instance = by_type["instance"]
    assert instance["synced"] and not instance["lock"]["held"]
    marker = instance["marker"]
    assert marker["index"] == report["index"] and marker["documents"] == 80
    assert set(marker) >= {"resource", "index", "sync_id", "started_at", "finished_at", "cells"}
    assert all(c["rows"] == c["documents"] == 40 for c in instance["cells"])
    assert instance["last_sync"]["rows"] == 80
    assert [i["role"] for i in instance["indexes"]].count("serving") == 1
    assert by_type["node"]["synced"]

    verified = cli(seeded, "verify", "--json")
    assert verified.exit_code == 0, verified.output
    assert [r["drift"] for r in json.loads(verified.stdout)["reports"]] == [0, 0]
    human = cli(seeded, "status")
    assert human.exit_code == 0 and "synced: yes" in human.stdout


def test_verify_exit_codes_and_repair(seeded: Settings) -> None:
    assert cli(seeded, "sync").exit_code == 0
    engine = build_engine(seeded)
    victims = [doc_id for doc_id, _ in engine.iter_versions("instance")][:3]
    engine.delete("instance", victims)
    engine.close()
    found = cli(seeded, "verify", "--type", "instance", "--cell", "cell1", "--cell", "cell2")
    assert found.exit_code == 1 and "instance: drift 3\n" in found.stdout
    repaired = cli(seeded, "verify", "--type", "instance", "--repair")
    assert repaired.exit_code == 0 and "instance: drift 3, 3 repaired" in repaired.stdout
    engine = build_engine(seeded)
    engine.delete("instance", [doc_id for doc_id, _ in engine.iter_versions("instance")][:2])
    engine.close()
    fixed = cli(seeded, "verify", "--type", "instance", "--repair", "--json")
    assert fixed.exit_code == 0
    assert sum(c["repaired"] for c in json.loads(fixed.stdout)["reports"][0]["cells"]) == 2
    assert cli(seeded, "verify", "--type", "instance").exit_code == 0


def test_a_second_sync_is_refused_with_exit_code_3(seeded: Settings) -> None:
    engine = build_engine(seeded)
    engine.ensure_ready("instance")
    with MaintenanceLock(engine, "instance", "sync"):
        refused = cli(seeded, "sync", "--json")
        verify = cli(seeded, "verify", "--type", "instance")
    engine.close()
    assert refused.exit_code == 3 and verify.exit_code == 3
    assert json.loads(refused.stdout)["error"].startswith("another instance sync, verify or purge")
    assert "is running" in refused.stderr


def test_bad_type_is_a_usage_error(seeded: Settings) -> None:
    assert cli(seeded, "sync", "--type", "flavor").exit_code == 2


def test_periodic_verify_repairs_drift(seeded: Settings) -> None:
    assert cli(seeded, "sync").exit_code == 0
    engine = build_engine(seeded)
    registry = CellRegistry.from_settings(seeded)
    victims = [doc_id for doc_id, _ in engine.iter_versions("instance")][:2]
    engine.delete("instance", victims)
    stop = threading.Event()
    thread = start_periodic_verify(engine, registry, 0.2, stop)
    deadline = time.monotonic() + 30
    while engine.get("instance", victims[0]) is None or engine.get("instance", victims[1]) is None:
        assert time.monotonic() < deadline, "the periodic verify did not repair"
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    last = engine.get_meta(LAST_VERIFY.format(resource="instance"))
    assert last is not None and last["repair"]
    engine.close()
    registry.close()


def test_verify_interval_setting_defaults_off() -> None:
    assert Settings().verify_interval is None
    assert load_settings(verify_interval=300).verify_interval == 300


def test_errors_are_one_line_not_tracebacks(seeded: Settings, monkeypatch: Any) -> None:
    # naming a cell that does not exist is a usage error (exit 2, cellsight.cli.errors)
    unknown = cli(seeded, "verify", "--cell", "nope")
    assert unknown.exit_code == 2 and "nope" in unknown.stderr
    partial = cli(seeded, "sync", "--cell", "nope")
    assert partial.exit_code == 2 and "nope" in partial.stderr
    monkeypatch.setenv("CELLSIGHT_SEARCH_URL", "http://127.0.0.1:9")  # nothing listens
    for args in (["status"], ["sync"], ["verify"]):
        result = cli(seeded, *args)
        assert result.exit_code == 1 and "unreachable" in result.stderr, result.output
        assert "Traceback" not in result.output


def test_a_sync_that_finds_no_cells_is_refused_and_the_index_keeps_serving(
    seeded: Settings, tmp_path: Path, monkeypatch: Any
) -> None:
    done = cli(seeded, "sync", "--json")
    assert done.exit_code == 0, done.output
    serving = json.loads(done.stdout)["index"]
    # The API database setting pointing at one without cells (a typo, or left unset):
    # the new index would be empty, swapped in and marked synced.
    monkeypatch.setenv("CELLSIGHT_API_DB_URL", f"sqlite:///{tmp_path / 'empty-api.db'}")
    refused = cli(seeded, "sync")
    assert refused.exit_code == 1, refused.output
    assert "no cells registered" in refused.stderr and "api_db_url" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.output
    monkeypatch.delenv("CELLSIGHT_API_DB_URL")
    status = cli(seeded, "status", "--json")
    instance = {s["resource"]: s for s in json.loads(status.stdout)}["instance"]
    assert instance["synced"] and instance["marker"]["index"] == serving
    assert instance["marker"]["documents"] == 80


def test_verify_checks_a_cell_named_twice_once_and_names_a_broken_one_briefly(
    seeded: Settings,
) -> None:
    assert cli(seeded, "sync").exit_code == 0
    registry = CellRegistry.from_settings(seeded)
    cell1 = registry.get_cell("cell1")
    cell2 = registry.get_cell("cell2")
    twice = cli(seeded, "verify", "--type", "instance", "--cell", "cell1", "--cell", cell1.uuid,
                "--json")  # fmt: skip
    assert twice.exit_code == 0, twice.output
    assert [c["name"] for c in json.loads(twice.stdout)["reports"][0]["cells"]] == ["cell1"]
    # A cell database without its tables: one line naming the driver's error, no SQL.
    with registry.cell_engine(cell2).begin() as conn:
        conn.exec_driver_sql("DROP TABLE instances")
    registry.close()
    broken = cli(seeded, "verify", "--type", "instance", "--json")
    assert broken.exit_code != 0
    errors = [e for c in json.loads(broken.stdout)["reports"][0]["cells"] for e in c["errors"]]
    assert errors == ["OperationalError: no such table: instances"], errors


def test_verify_drops_what_a_killed_sync_left_and_sees_orphans_past_it(
    seeded: Settings,
) -> None:
    assert cli(seeded, "sync").exit_code == 0
    engine = build_engine(seeded)
    current = layout(engine, "instance")
    assert current.serving is not None
    serving = current.serving.name
    # A sync killed mid-load: its new index behind the write alias, part-filled.
    stray = new_index_name(engine, "instance")
    engine.create_index("instance", stray, bulk_load=True)
    engine.set_aliases("instance", read=serving, write=[serving, stray])
    # An instance whose row is gone from its cell (archived): an orphan in the index.
    registry = CellRegistry.from_settings(seeded)
    cell1 = registry.get_cell("cell1")
    with registry.cell_engine(cell1).begin() as conn:
        victim = conn.exec_driver_sql("SELECT uuid FROM instances LIMIT 1").scalar_one()
        conn.exec_driver_sql("DELETE FROM instances WHERE uuid = ?", (victim,))
    registry.close()
    found = cli(seeded, "verify", "--type", "instance", "--repair", "--json")
    assert found.exit_code == 0, found.output
    cells = {c["name"]: c for c in json.loads(found.stdout)["reports"][0]["cells"]}
    assert cells["cell1"]["orphaned"] == 1 and cells["cell1"]["repaired"] == 1
    after = layout(engine, "instance")
    assert after.stray == [] and after.writers == [serving]
    stored = engine.get("instance", victim)
    assert stored is not None and stored.document["deleted"] is True
    engine.close()


def test_repair_does_not_tombstone_a_cell_that_holds_no_rows(seeded: Settings) -> None:
    assert cli(seeded, "sync").exit_code == 0
    registry = CellRegistry.from_settings(seeded)
    cell2 = registry.get_cell("cell2")
    # The cell's database URL now names an empty one (or its rows are gone): every one
    # of its 40 documents reads as an orphan.
    with registry.cell_engine(cell2).begin() as conn:
        uuids = list(conn.exec_driver_sql("SELECT uuid FROM instances").scalars())
        conn.exec_driver_sql("DELETE FROM instances")
    registry.close()
    held = cli(seeded, "verify", "--type", "instance", "--repair", "--json")
    assert held.exit_code == 1, held.output
    cells = {c["name"]: c for c in json.loads(held.stdout)["reports"][0]["cells"]}
    cell2 = cells["cell2"]
    # The seed's deleted instances are tombstones already; the live ones are orphans.
    assert cell2["orphaned"] + cell2["tombstones_without_row"] == 40
    assert cell2["orphaned"] > 0 and cell2["repaired"] == 0
    assert "holds no instance rows" in cell2["errors"][0]
    assert cells["cell1"]["errors"] == [] and cells["cell1"]["drift"] == 0
    engine = build_engine(seeded)
    deleted = [d.document["deleted"] for d in engine.get_many("instance", uuids).values()]
    assert deleted.count(False) == cell2["orphaned"]  # none tombstoned
    engine.close()


def test_verify_reports_documents_of_no_registered_cell(seeded: Settings) -> None:
    assert cli(seeded, "sync").exit_code == 0
    engine = build_engine(seeded)
    template = next(iter(engine.get_many("instance", _some_uuids(seeded)).values()))
    stray = "6c0ffee0-0000-4000-8000-000000000001"
    doc = {**template.document, "uuid": stray, "cell_uuid": "0ddba11-no-such-cell"}
    engine.bulk([WriteOp("instance", stray, 1, doc)])
    engine.close()
    found = cli(seeded, "verify", "--type", "instance")
    assert found.exit_code == 1, found.output
    assert "1 documents belong to no registered cell" in found.stdout
    # The verdict line says why it exits 1 (it read "no drift" alone).
    assert "instance: no drift; 1 documents of no registered cell" in found.stdout
    as_json = cli(seeded, "verify", "--type", "instance", "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["reports"][0]["unattributed"] == 1


def _some_uuids(settings: Settings) -> list[str]:
    registry = CellRegistry.from_settings(settings)
    try:
        with registry.cell_engine(registry.get_cell("cell1")).connect() as conn:
            return list(conn.exec_driver_sql("SELECT uuid FROM instances LIMIT 3").scalars())
    finally:
        registry.close()
