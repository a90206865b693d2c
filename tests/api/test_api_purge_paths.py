"""After ``index purge``, both paths list the same servers.

Purge removes old tombstones from the index only: the cells keep the rows (as Nova keeps
them until ``archive_deleted_rows``). The fan-out path reads those rows, so without the
purge floor it listed purged servers that the index path no longer has (``deleted=true``,
``changes-since``, query v2), and paging by a deleted marker differed. Both paths now
leave out what is deleted before the floor, which the API reads from the index whenever
it talks to it, and from the API database, where the purge records it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cellsight.api.headers import PATH
from cellsight.cells.database import write_transaction
from cellsight.cells.schema import api_meta
from cellsight.indexer.engines.base import EngineUnavailable
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from cellsight.indexer.purge import (
    PURGE_FLOOR_KEY,
    BadFloor,
    purge_tombstones,
    read_database_floor,
    read_floor,
)
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.cli.test_cli_errors import closed_port
from tests.support.api_world import ADMIN, World, build_world, load_index, make_client

LISTINGS = [
    "/v2.1/servers/detail?all_tenants=1&deleted=true",
    "/v2.1/servers?all_tenants=1&changes-since=2000-01-01T00:00:00Z",
    "/v2.1/servers?all_tenants=1&status=DELETED&sort_key=updated_at&sort_dir=asc",
    "/v2.1/servers?all_tenants=1&deleted=true&limit=2",
]


@pytest.fixture(scope="module", params=["sqlite_world", "postgres_world", "mariadb_world"])
def world(request: pytest.FixtureRequest) -> World:
    """The shared read-only worlds: purge changes the index only, never a cell."""
    found: World = request.getfixturevalue(request.param)
    return found


def tombstones(world: World) -> list[tuple[datetime, str]]:
    return sorted((r["deleted_at"], r["uuid"]) for _, r in world.rows() if r["deleted"])


@pytest.fixture(scope="module")
def purged(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EmbeddedEngine, datetime, list[str]]]:
    """The world's index with the older half of its tombstones purged."""
    engine = EmbeddedEngine(tmp_path_factory.mktemp("purge-index") / "index.db", prefix="pp")
    load_index(engine, world)
    dead = tombstones(world)
    assert len({at for at, _ in dead}) >= 3, "the world must hold tombstones of several ages"
    cut = sorted({at for at, _ in dead})[len({at for at, _ in dead}) // 2]
    assert purge_tombstones(engine, cut) > 0
    yield engine, cut, [u for at, u in dead if at < cut]
    engine.close()


def ids(body: dict[str, Any]) -> list[str]:
    return [s["id"] for s in body["servers"]]


def fanout_after_index(tmp: Path, world: World, engine: EmbeddedEngine) -> TestClient:
    """An app that answered once from the index, then lost it (flag kept until restart)."""
    client = make_client(tmp, world, engine, safe_connect_cooldown=0)
    first = client.get("/v2.1/servers?limit=1", headers=ADMIN)
    assert first.headers[PATH] == "index"
    client.app.state.safe_connect.failed(EngineUnavailable("index down"))  # type: ignore[attr-defined]
    return client


@pytest.fixture
def both(
    world: World, purged: tuple[EmbeddedEngine, datetime, list[str]], tmp_path: Path
) -> tuple[TestClient, TestClient]:
    """The purged index's app, and one that answered from it once and then fell back to
    the fan-out."""
    engine = purged[0]
    index = make_client(tmp_path / "index", world, engine)
    return index, fanout_after_index(tmp_path / "fanout", world, engine)


def test_both_paths_leave_out_purged_servers(
    purged: tuple[EmbeddedEngine, datetime, list[str]], both: tuple[TestClient, TestClient]
) -> None:
    gone = purged[2]
    index, fanout = both
    for url in LISTINGS:
        a, b = index.get(url, headers=ADMIN), fanout.get(url, headers=ADMIN)
        assert (a.headers[PATH], b.headers[PATH]) == ("index", "fanout")
        assert a.status_code == b.status_code == 200, (a.json(), b.json())
        assert a.json() == b.json(), url
        assert not set(ids(b.json())) & set(gone), url
    # Query v2 reads through the same search.
    body = {"fields": ["uuid"], "filter": ["==", "deleted", True]}
    a, b = (c.post("/v2.1/query/instance", json=body, headers=ADMIN) for c in (index, fanout))
    assert a.status_code == b.status_code == 200, (a.json(), b.json())
    assert a.json() == b.json()
    listed = {row[0][1] for row in b.json()["data"]}
    assert listed and not listed & set(gone)


def test_paging_from_a_purged_marker_agrees(
    purged: tuple[EmbeddedEngine, datetime, list[str]], both: tuple[TestClient, TestClient]
) -> None:
    gone = purged[2]
    index, fanout = both
    for marker in gone:
        url = f"/v2.1/servers?all_tenants=1&deleted=true&limit=3&marker={marker}"
        a, b = index.get(url, headers=ADMIN), fanout.get(url, headers=ADMIN)
        assert a.status_code == b.status_code == 200
        assert a.json() == b.json(), url


def test_a_members_changes_since_agrees(
    world: World,
    purged: tuple[EmbeddedEngine, datetime, list[str]],
    both: tuple[TestClient, TestClient],
) -> None:
    gone = purged[2]
    owners = {r["uuid"]: r["project_id"] for _, r in world.rows()}
    index, fanout = both
    for project in sorted({owners[u] for u in gone}):
        token = {"X-Auth-Token": f"someone:{project}"}
        url = "/v2.1/servers/detail?changes-since=2000-01-01"
        a, b = index.get(url, headers=token), fanout.get(url, headers=token)
        assert a.json() == b.json(), project
        assert not set(ids(b.json())) & set(gone)


def test_a_fanout_app_reads_the_floor_from_an_unsynced_index(
    world: World, purged: tuple[EmbeddedEngine, datetime, list[str]], tmp_path: Path
) -> None:
    """Reachable but not marked synced (a first sync under way): the floor still holds."""
    _, cut, gone = purged
    unsynced = EmbeddedEngine(tmp_path / "unsynced.db", prefix="pu")
    unsynced.ensure_ready("instance")
    purge_tombstones(unsynced, cut)  # records the floor; nothing to remove there
    client = make_client(tmp_path / "app", world, unsynced)
    response = client.get("/v2.1/servers?all_tenants=1&deleted=true", headers=ADMIN)
    assert response.headers[PATH] == "fanout"
    assert response.status_code == 200
    listed = set(ids(response.json()))
    assert listed and not listed & set(gone)
    unsynced.close()


def test_purge_removes_what_an_earlier_higher_floor_covers(tmp_path: Path) -> None:
    """A second purge with a longer retention keeps the higher floor, and removes the
    tombstones below it (a full sync would not rebuild them either)."""
    from cellsight.indexer.engines.base import WriteOp

    engine = EmbeddedEngine(tmp_path / "index.db", prefix="pf")
    engine.ensure_ready("instance")
    late = "00000000-0000-4000-8000-000000000001"
    doc = {
        "uuid": late,
        "deleted": True,
        "deleted_at": "2025-03-01T00:00:00.000000Z",
        "state": "deleted",
        "version": 3,
    }
    purge_tombstones(engine, datetime.fromisoformat("2025-05-01T00:00:00+00:00"))
    # A delete written after that purge, of an instance deleted before its floor (its
    # document existed, so the writer took it).
    engine.bulk([WriteOp("instance", late, 3, doc)])
    engine.refresh("instance")
    removed = purge_tombstones(engine, datetime.fromisoformat("2025-01-01T00:00:00+00:00"))
    assert removed == 1
    assert read_floor(engine) == datetime.fromisoformat("2025-05-01T00:00:00+00:00")
    engine.close()


def test_a_malformed_floor_is_counted_not_a_500(world: World, tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="pm")
    load_index(engine, world)
    engine.put_meta(PURGE_FLOOR_KEY, {"before": "not a date"})
    client = make_client(tmp_path / "app", world, engine)
    response = client.get("/v2.1/servers?all_tenants=1&deleted=true", headers=ADMIN)
    assert (response.status_code, response.headers[PATH]) == (200, "index")
    assert len(ids(response.json())) == len(tombstones(world))
    metrics = client.get("/metrics").text
    assert 'cellsight_api_bug_fallbacks_total{kind="BadFloor",where="purge floor"} 1.0' in metrics
    engine.close()


def test_the_background_probe_reads_the_floor(
    world: World, purged: tuple[EmbeddedEngine, datetime, list[str]], tmp_path: Path
) -> None:
    engine, cut, _ = purged
    client = make_client(tmp_path / "app", world, engine)
    search = client.app.state.search  # type: ignore[attr-defined]
    assert search.purge_floor is None
    assert search.probe() == "synced"
    assert search.purge_floor == cut


def test_an_api_that_never_reached_the_index_has_the_floor_from_the_api_database(
    tmp_path: Path,
) -> None:
    """The floor is recorded in the API database too: an API started while the index is
    down, or whose index came back without its meta records, leaves out what a purge
    removed, as the index path does."""
    world = build_world(tmp_path / "world", "sqlite")
    try:
        engine = EmbeddedEngine(tmp_path / "index.db", prefix="pd")
        load_index(engine, world)
        dead = tombstones(world)
        cut = sorted({at for at, _ in dead})[len({at for at, _ in dead}) // 2]
        gone = {u for at, u in dead if at < cut}
        assert purge_tombstones(engine, cut, registry=world.registry) == len(gone) > 0
        assert read_database_floor(world.registry) == read_floor(engine) == cut
        down = OpenSearchEngine(f"http://127.0.0.1:{closed_port()}", prefix="pd", timeout=0.5)
        clients = {
            "index": make_client(tmp_path / "index", world, engine),
            "down since start": make_client(tmp_path / "down", world, down),
            "index without records": make_client(tmp_path / "empty", world),
        }
        for url in LISTINGS:
            answers = {name: c.get(url, headers=ADMIN) for name, c in clients.items()}
            paths = {name: a.headers[PATH] for name, a in answers.items()}
            assert paths == {
                "index": "index",
                "down since start": "fanout",
                "index without records": "fanout",
            }
            bodies = [a.json() for a in answers.values()]
            assert all(b == bodies[0] for b in bodies), url
            assert not set(ids(bodies[0])) & gone, url
        for client in clients.values():
            client.close()
        engine.close()
        # An engine that came back empty, rebuilt by a full sync: what the purge removed
        # stays removed, and the writer's guard against its return is recorded again.
        fresh = EmbeddedEngine(tmp_path / "fresh.db", prefix="pd")
        run_sync(fresh, world.registry, SyncOptions())
        assert [u for u in gone if fresh.get("instance", u) is not None] == []
        assert fresh.count("instance") == len(world.rows()) - len(gone)
        assert read_floor(fresh) == cut
        fresh.close()
    finally:
        world.close()


@pytest.mark.parametrize("raw", ['{"before": "x"}', "null", "[1]", "not json", '"text"'])
def test_a_malformed_floor_in_the_api_database_is_counted_not_a_500(
    tmp_path: Path, raw: str
) -> None:
    """A record written by hand that holds no date-time (the review found ``null``, a
    list and non-JSON made every listing a 500)."""
    world = build_world(tmp_path / "world", "sqlite")
    try:
        with write_transaction(world.registry.api_engine) as conn:
            conn.execute(
                api_meta.insert().values(
                    key=PURGE_FLOOR_KEY, value=raw, updated_at=datetime.now(UTC)
                )
            )
        if raw == "null":  # JSON's null: no floor recorded
            assert read_database_floor(world.registry) is None
        else:
            with pytest.raises(BadFloor):
                read_database_floor(world.registry)
        client = make_client(tmp_path / "app", world)
        for _ in range(2):  # and again, from the floor known so far
            response = client.get("/v2.1/servers/detail?all_tenants=1&limit=5", headers=ADMIN)
            assert response.status_code == 200, response.text[:300]
        counted = 'where="purge floor in the API database"' in client.get("/metrics").text
        assert counted == (raw != "null")
        client.close()
    finally:
        world.close()


def test_a_full_sync_records_the_index_floor_in_the_api_database(tmp_path: Path) -> None:
    """A floor an earlier version's purge recorded in the index only reaches the API
    database at the next full sync, so an API that cannot reach the index knows it."""
    world = build_world(tmp_path / "world", "sqlite")
    try:
        engine = EmbeddedEngine(tmp_path / "index.db", prefix="pb")
        load_index(engine, world)
        cut = sorted(at for at, _ in tombstones(world))[1]
        purge_tombstones(engine, cut)  # no registry: the index alone, as before
        assert read_database_floor(world.registry) is None
        run_sync(engine, world.registry, SyncOptions())
        assert read_database_floor(world.registry) == cut == read_floor(engine)
        engine.close()
    finally:
        world.close()
