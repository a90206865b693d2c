"""Soft-deleted servers (Nova's deferred delete, vm_state ``soft-delete``) are listed as
Nova's ``instance_get_all_by_filters_sort`` lists them, on both paths: a normal listing
leaves them out, ``deleted=true`` lists them with the deleted ones, so
``status=SOFT_DELETED`` alone lists nothing; changes (``changes-since``) include them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cellsight.api.headers import PATH
from cellsight.cells.schema import instances
from tests.support.api_world import ADMIN, World, both_paths, build_world


@pytest.fixture(scope="module")
def soft_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("soft-world"), "sqlite")
    for cell in world.registry.list_cells():
        with world.registry.cell_engine(cell).begin() as conn:
            conn.execute(
                instances.update()
                .where((instances.c.id % 11) == 2, instances.c.deleted.is_(False))
                .values(vm_state="soft-delete", task_state=None)
            )
    yield world
    world.close()


@pytest.fixture(scope="module")
def clients(
    soft_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestClient]]:
    with both_paths(soft_world, tmp_path_factory.mktemp("soft-clients"), "sd") as clients:
        yield clients


def ids(world: World, *, deleted: bool, soft: bool) -> set[str]:
    return {
        r["uuid"]
        for _, r in world.rows()
        if bool(r["deleted"]) == deleted
        and (r["vm_state"] == "soft-delete") == soft
        and not r.get("forthcoming")
    }


def listed(client: TestClient, path: str, query: str) -> set[str]:
    url = f"/v2.1/servers/detail?limit=1000&all_tenants=1&{query}"
    response = client.get(url, headers=ADMIN)
    assert (response.status_code, response.headers[PATH]) == (200, path), response.text
    return {s["id"] for s in response.json()["servers"]}


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_soft_deleted_servers_are_listed_as_nova_lists_them(
    clients: dict[str, TestClient], soft_world: World, path: str
) -> None:
    client = clients[path]
    soft = ids(soft_world, deleted=False, soft=True)
    live = ids(soft_world, deleted=False, soft=False)
    gone = ids(soft_world, deleted=True, soft=False)
    assert soft and live and gone  # the world holds all three
    assert listed(client, path, "") == live
    assert listed(client, path, "deleted=true") == gone | soft
    assert listed(client, path, "status=SOFT_DELETED") == set()
    assert listed(client, path, "status=SOFT_DELETED&deleted=true") == soft
    changed = {r["uuid"] for _, r in soft_world.rows() if r["updated_at"] is not None}
    assert listed(client, path, "changes-since=1970-01-01") & soft == soft & changed
