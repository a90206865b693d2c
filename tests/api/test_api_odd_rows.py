"""Cell rows written by something other than Cellsight's operations (an adversarial
probe wrote them with plain SQL): one that does not read as an instance made every
fan-out listing that reached it a 500. Its cell is now skipped and named in the
skipped-cells header, as a cell that fails is, and the other cells' rows are listed."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.headers import SKIPPED_CELLS
from tests.support.api_world import ADMIN, api_settings, build_world


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("metadata", '{"a": 1}'),  # a value the model refuses (metadata values are strings)
        ("tags", "[1, 2]"),
        ("flavor", "{"),  # JSON that does not parse
        ("created_at", "notadate"),  # a date that is not one
        ("progress", 1.5),
        ("revision", "x"),
    ],
)
def test_a_row_that_does_not_read_skips_its_cell_by_name(
    tmp_path: Path, column: str, value: object
) -> None:
    world = build_world(tmp_path / "w", "sqlite")
    broken = world.registry.list_cells()[0]
    victim = next(
        row["uuid"] for cell, row in world.rows() if cell == broken.uuid and not row["deleted"]
    )
    others = {  # what a default listing shows
        row["uuid"]
        for cell, row in world.rows()
        if cell != broken.uuid and not row["deleted"] and not row["forthcoming"]
    }
    cell_engine = sa.create_engine(broken.database_url)
    with cell_engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE instances SET {column} = :value WHERE uuid = :uuid"),
            {"value": value, "uuid": victim},
        )
    cell_engine.dispose()
    app = create_app(api_settings(tmp_path), registry=world.registry)
    with TestClient(app) as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=1000", headers=ADMIN)
    assert listing.status_code == 200, listing.text
    assert broken.uuid in listing.headers[SKIPPED_CELLS]
    listed = {server["id"] for server in listing.json()["servers"]}
    assert others <= listed and victim not in listed
    world.registry.close()


@pytest.mark.parametrize("per_project_cells", [False, True])
def test_a_row_without_its_mapping_on_both_paths(tmp_path: Path, per_project_cells: bool) -> None:
    """An adversarial probe: a project's server whose instance mapping is missing was
    listed by the index and left out by the fan-out, which read only the cells the
    project's mappings name. Nova reads every cell unless told otherwise
    (``instance_list_per_project_cells``), and so does Cellsight now."""
    from cellsight.cells.schema import instance_mappings
    from cellsight.indexer.engines.embedded import EmbeddedEngine
    from tests.support.api_world import load_index

    world = build_world(tmp_path / "w", "sqlite")
    victim = world.listed_server()
    world.set_row(victim, project_id="lonely")
    with world.registry.api_engine.begin() as conn:
        conn.execute(instance_mappings.delete().where(instance_mappings.c.instance_uuid == victim))
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="lonely")
    load_index(engine, world)
    settings = api_settings(tmp_path, instance_list_per_project_cells=per_project_cells)
    listed: dict[str, list[str]] = {}
    for path, app in (
        ("index", create_app(settings, engine=engine, registry=world.registry)),
        ("fanout", create_app(settings, registry=world.registry)),
    ):
        with TestClient(app) as client:
            for who, query in (("member", ""), ("admin", "?all_tenants=1&project_id=lonely")):
                headers = {"X-Auth-Token": "u:lonely"} if who == "member" else ADMIN
                response = client.get(f"/v2.1/servers{query}", headers=headers)
                assert response.status_code == 200, response.text
                assert response.headers["X-Cellsight-Path"] == path
                listed[f"{path} {who}"] = [s["id"] for s in response.json()["servers"]]
    assert listed["index member"] == listed["index admin"] == [victim]
    expected = [] if per_project_cells else [victim]
    assert listed["fanout member"] == listed["fanout admin"] == expected
    engine.close()
    world.registry.close()
