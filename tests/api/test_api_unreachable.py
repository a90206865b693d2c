"""A cell that stops answering mid-test is skipped within its deadline and reported.

Real failures, no mocks: a PostgreSQL cell whose ``instances`` table the test locks
(the API's SELECT blocks until PostgreSQL's ``statement_timeout`` cancels it), and a
MariaDB cell whose database is dropped under the API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.api.headers import PATH, SKIPPED_CELLS, parse_skipped
from tests.support.api_world import ADMIN, World, build_world, make_client
from tests.support.services import drop_database

DEADLINE = 1.0


@pytest.fixture
def pg_world(tmp_path: Path, postgres_server: sa.URL) -> Iterator[World]:
    world = build_world(tmp_path / "pg", "postgresql", postgres_server)
    yield world
    world.close()


def test_a_locked_postgresql_cell_is_skipped_within_its_deadline(
    pg_world: World, tmp_path: Path
) -> None:
    client = make_client(tmp_path, pg_world, cell_timeout=DEADLINE)
    listing = "/v2.1/servers/detail?all_tenants=1"
    full = client.get(listing, headers=ADMIN).json()["servers"]
    victim = pg_world.registry.list_cells()[1]
    victims = {
        row["uuid"] for cell, row in pg_world.rows() if cell == victim.uuid and not row["deleted"]
    }
    project = next(r["project_id"] for c, r in pg_world.rows() if c == victim.uuid)
    locker = sa.create_engine(sa.make_url(victim.database_url))
    with locker.connect() as conn:
        trans = conn.begin()
        conn.exec_driver_sql("LOCK TABLE instances IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        response = client.get(listing, headers=ADMIN)
        elapsed = time.monotonic() - started
        # Nova's down-cell records (2.69+) for the skipped cell's instances.
        v269 = {**ADMIN, "OpenStack-API-Version": "compute 2.69"}
        partial = client.get(listing, headers=v269)
        # Not with a sort, paging or any filter but all_tenants (Nova's rule).
        withheld = [
            client.get(f"{listing}&sort_key=display_name", headers=v269),
            client.get(f"{listing}&limit=1000", headers=v269),
            client.get(f"/v2.1/servers/detail?project_id={project}", headers=v269),
            client.get(f"{listing}&name=a", headers=v269),
        ]
        # A show dates the server by its mapping, as the listing's record does (it was
        # "created": null: an adversarial probe).
        one = sorted(victims)[0]
        shown = client.get(f"/v2.1/servers/{one}", headers=v269)
        trans.rollback()
    locker.dispose()
    assert response.status_code == 200 and response.headers[PATH] == "fanout"
    assert elapsed < DEADLINE + 1.5, f"took {elapsed:.2f}s"
    assert parse_skipped(response.headers[SKIPPED_CELLS]) == [(victim.name, victim.uuid, "timeout")]
    ids = {s["id"] for s in response.json()["servers"]}
    assert ids == {s["id"] for s in full} - victims
    unknown = [s for s in partial.json()["servers"] if s["status"] == "UNKNOWN"]
    assert unknown and {s["id"] for s in unknown} <= {
        r["uuid"] for c, r in pg_world.rows() if c == victim.uuid
    }
    assert set(unknown[0]) == {"id", "status", "tenant_id", "created", "links"}
    assert partial.json()["servers"][: len(unknown)] == unknown  # prefixed, as in Nova
    assert shown.status_code == 200, shown.text
    record = shown.json()["server"]
    assert record["status"] == "UNKNOWN" and record["created"] is not None
    assert record["created"] == {s["id"]: s for s in unknown}[one]["created"]
    for answer in withheld:
        assert answer.status_code == 200 and SKIPPED_CELLS in answer.headers
        assert [s for s in answer.json()["servers"] if s["status"] == "UNKNOWN"] == []
    # The lock is gone: every cell answers again.
    again = client.get(listing, headers=ADMIN)
    assert SKIPPED_CELLS not in again.headers and again.json()["servers"] == full
    client.close()


def test_a_dropped_mariadb_cell_is_skipped(tmp_path: Path, mariadb_server: sa.URL) -> None:
    world = build_world(tmp_path / "maria", "mariadb", mariadb_server)
    try:
        client = make_client(tmp_path, world, cell_timeout=DEADLINE)
        listing = "/v2.1/servers?all_tenants=1"
        assert SKIPPED_CELLS not in client.get(listing, headers=ADMIN).headers
        server, name = world.dropped[0]
        drop_database(server, name)
        response = client.get(listing, headers=ADMIN)
        assert response.status_code == 200
        (skipped,) = parse_skipped(response.headers[SKIPPED_CELLS])
        assert skipped[2] == "error"
        metrics = client.get("/metrics").text
        counted = f'cellsight_api_cells_skipped_total{{cell="{skipped[0]}",reason="error"}} 1.0'
        assert counted in metrics
        # Readiness reports the cell, and is no listing: a probe saw each /readyz count it.
        for _ in range(3):
            ready = client.get("/readyz").json()
            assert {c["name"]: c["state"] for c in ready["cells"]}[skipped[0]] == "error"
        assert counted in client.get("/metrics").text
        client.close()
    finally:
        world.close()
