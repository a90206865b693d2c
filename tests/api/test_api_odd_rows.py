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


def _walk(client: TestClient, query: str) -> list[str]:
    """Every page of ``query`` by its ``servers_links`` marker, ids in order."""
    ids: list[str] = []
    url = f"/v2.1/servers/detail?{query}"
    for _ in range(500):
        response = client.get(url, headers=ADMIN)
        assert response.status_code == 200, response.text
        body = response.json()
        ids += [s["id"] for s in body["servers"]]
        links = [link["href"] for link in body.get("servers_links", []) if link["rel"] == "next"]
        if not links:
            return ids
        url = links[0][links[0].index("/v2.1/") :]
    raise AssertionError("the walk did not end")


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mariadb"])
def test_a_walk_in_the_default_order_reaches_rows_without_created_at(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    """An adversarial probe: a row whose created_at is NULL (written by hand: Nova always
    sets it) was listed last on one page, but a walk by marker in the default order
    (``created_at`` descending, nulls last) never reached it, on either path: the keyset's
    bound on a never-null key (``created_at <= marker's``) left it out of every page after
    the first. Those rows now fill the page the bounded query leaves short."""
    from tests.support.api_world import both_paths

    fixture = {"postgresql": "postgres_server", "mariadb": "mariadb_server"}.get(dialect)
    server = None if fixture is None else request.getfixturevalue(fixture)
    world = build_world(tmp_path / "w", dialect, server)
    nulls = sorted(
        row["uuid"]
        for _, row in world.rows()
        if not row["deleted"] and not row["forthcoming"] and row["id"] % 7 == 3
    )[:3]
    for uuid in nulls:
        world.set_row(uuid, created_at=None)
    with both_paths(world, tmp_path, "nulltail") as clients:
        whole = {
            path: [
                s["id"]
                for s in client.get("/v2.1/servers?all_tenants=1&limit=1000", headers=ADMIN).json()[
                    "servers"
                ]
            ]
            for path, client in clients.items()
        }
        assert whole["index"] == whole["fanout"]
        assert set(nulls) <= set(whole["index"])
        assert whole["index"][-len(nulls) :] == sorted(nulls)  # nulls last, then by uuid
        for limit in (1, 2, 7):
            for path, client in clients.items():
                walked = _walk(client, f"all_tenants=1&limit={limit}")
                assert walked == whole["index"], (path, limit)
    world.close()


def test_rows_past_the_contracts_lengths_and_counts_read_as_stored_on_every_path(
    tmp_path: Path,
) -> None:
    """An adversarial probe: a sync indexed rows past the contract's lengths and counts
    (a 1 MB hostname, 10,000 metadata items or tags), as the README says it does, but the
    API read them back through the bounds: a 500 for the server, for a listing whose
    marker it was, and for a fan-out listing that reached it. Read as stored, they show
    alike on both paths; numbers no JSON can carry still make the row unreadable, named,
    as a down cell is (never a 500)."""
    from tests.support.api_world import both_paths

    world = build_world(tmp_path / "w", "sqlite")
    listed = [
        row["uuid"] for _, row in world.rows() if not row["deleted"] and not row["forthcoming"]
    ]
    long_name, many_meta, many_tags = listed[:3]
    world.set_row(long_name, hostname="h" * 1_000_000)
    world.set_row(many_meta, metadata={f"k{i}": f"v{i}" for i in range(10_000)})
    world.set_row(many_tags, tags=[f"t{i}" for i in range(10_000)])
    with both_paths(world, tmp_path, "stored") as clients:
        for path, client in clients.items():
            for uuid in (long_name, many_meta, many_tags):
                shown = client.get(f"/v2.1/servers/{uuid}", headers=ADMIN)
                assert shown.status_code == 200, (path, shown.text[:300])
                listing = client.get(
                    f"/v2.1/servers/detail?all_tenants=1&limit=3&marker={uuid}", headers=ADMIN
                )
                assert listing.status_code == 200, (path, listing.text[:300])
            server = client.get(f"/v2.1/servers/{many_meta}", headers=ADMIN).json()["server"]
            assert len(server["metadata"]) == 10_000
            whole = client.get(
                "/v2.1/servers/detail?all_tenants=1&limit=1000",
                headers={**ADMIN, "OpenStack-API-Version": "compute 2.3"},  # shows hostname
            )
            assert whole.status_code == 200 and SKIPPED_CELLS not in whole.headers, path
            hosts = {s["id"]: s.get("OS-EXT-SRV-ATTR:hostname") for s in whole.json()["servers"]}
            assert hosts[long_name] == "h" * 1_000_000, path
    world.close()


@pytest.mark.parametrize("value", [int("1" + "9" * 400), 10**19])
def test_a_row_with_a_number_past_64_bits_is_named_never_a_500(tmp_path: Path, value: int) -> None:
    world = build_world(tmp_path / "w", "sqlite")
    cell, row = next((c, r) for c, r in world.rows() if not r["deleted"] and not r["forthcoming"])
    flavor = dict(row["flavor"])
    flavor["memory_mb"] = value
    world.set_row(row["uuid"], flavor=flavor)
    app = create_app(api_settings(tmp_path), registry=world.registry)
    with TestClient(app) as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=1000", headers=ADMIN)
        assert listing.status_code == 200, listing.text[:300]
        assert cell in listing.headers[SKIPPED_CELLS]  # skipped and named, as before
        old = client.get(f"/v2.1/servers/{row['uuid']}", headers=ADMIN)
        assert old.status_code == 503, old.text[:300]
        new = client.get(
            f"/v2.1/servers/{row['uuid']}",
            headers={**ADMIN, "OpenStack-API-Version": "compute 2.69"},
        )
        assert new.status_code == 200, new.text[:300]
        assert new.json()["server"]["status"] == "UNKNOWN"
        assert "reason=error" in new.headers[SKIPPED_CELLS]
        marked = client.get(
            f"/v2.1/servers?all_tenants=1&limit=5&marker={row['uuid']}", headers=ADMIN
        )
        assert marked.status_code == 503, marked.text[:300]
        assert "does not read as an instance" in marked.text
    world.close()


def test_the_syncs_reference_path_reads_a_row_past_the_counts_as_its_fast_path_does(
    tmp_path: Path,
) -> None:
    """An adversarial probe: a row the fast path declines (a year before 1000) went to the
    reference path, which refused its 2,000 metadata items (``OutOfRange``), and the whole
    cell's sync failed, naming no instance; the same items with an ordinary date synced."""
    from datetime import UTC, datetime

    from cellsight.indexer.row_documents import SYNC_EVENT, reference_document

    world = build_world(tmp_path / "w", "sqlite")
    cell, row = next((c, r) for c, r in world.rows() if not r["deleted"])
    row = {
        **row,
        "created_at": datetime(500, 1, 1, tzinfo=UTC),
        "metadata": {f"k{i}": f"v{i}" for i in range(2000)},
    }
    document = reference_document(row, cell, SYNC_EVENT)
    assert len(document["metadata"]) == 2000
    assert document["created_at"].startswith("0500-01-01")
    world.close()


def test_an_upper_case_uuid_finds_its_server_and_its_marker_on_both_paths(tmp_path: Path) -> None:
    """An adversarial probe: ``GET /servers/{UPPER-CASE-UUID}`` was a 404 and such a
    marker a 400, where Nova finds both through MySQL's case-insensitive collation."""
    from tests.support.api_world import both_paths

    world = build_world(tmp_path / "w", "sqlite")
    victim = world.listed_server()
    with both_paths(world, tmp_path, "upper") as clients:
        for path, client in clients.items():
            shown = client.get(f"/v2.1/servers/{victim.upper()}", headers=ADMIN)
            assert shown.status_code == 200, (path, shown.text)
            assert shown.json()["server"]["id"] == victim  # as stored
            lower = client.get(
                f"/v2.1/servers?all_tenants=1&limit=3&marker={victim}", headers=ADMIN
            )
            upper = client.get(
                f"/v2.1/servers?all_tenants=1&limit=3&marker={victim.upper()}", headers=ADMIN
            )
            assert upper.status_code == 200, (path, upper.text)
            assert upper.json()["servers"] == lower.json()["servers"], path
            braces = client.get(f"/v2.1/servers/{{{victim}}}", headers=ADMIN)
            assert braces.status_code == 404, path  # as Nova: no row holds that form
    world.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [("flavor", "{"), ("metadata", "[1"), ("created_at", "notadate"), ("deleted_at", "2020-13-45")],
)
def test_a_value_that_fails_as_it_is_fetched_is_named_by_row_and_column_never_a_500(
    tmp_path: Path, column: str, value: str
) -> None:
    """An unparsable JSON column or a date that is not one fails while the row is fetched
    (the driver's conversion), before the row exists: show answered a 500, and the
    listing's skipped cell named row '?' and no column."""
    from cellsight.cells.database import connect
    from cellsight.cells.errors import UnreadableRow
    from cellsight.cells.reads import get_instance

    world = build_world(tmp_path / "w", "sqlite")
    broken = world.registry.list_cells()[0]
    victim = next(
        row["uuid"] for cell, row in world.rows() if cell == broken.uuid and not row["deleted"]
    )
    cell_engine = sa.create_engine(broken.database_url)
    with cell_engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE instances SET {column} = :value WHERE uuid = :uuid"),
            {"value": value, "uuid": victim},
        )
    with connect(cell_engine) as conn, pytest.raises(UnreadableRow) as raised:
        get_instance(conn, victim)
    assert victim in str(raised.value) and f"column {column}:" in str(raised.value)
    cell_engine.dispose()
    app = create_app(api_settings(tmp_path), registry=world.registry)
    with TestClient(app) as client:
        old = client.get(f"/v2.1/servers/{victim}", headers=ADMIN)
        assert old.status_code == 503, old.text[:300]
        new = client.get(
            f"/v2.1/servers/{victim}", headers={**ADMIN, "OpenStack-API-Version": "compute 2.69"}
        )
        assert new.status_code == 200, new.text[:300]
        assert new.json()["server"]["status"] == "UNKNOWN"
        marked = client.get(f"/v2.1/servers?all_tenants=1&limit=5&marker={victim}", headers=ADMIN)
        assert marked.status_code == 503, marked.text[:300]
        assert "does not read as an instance" in marked.text
    world.registry.close()
