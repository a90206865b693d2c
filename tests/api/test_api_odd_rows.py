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
