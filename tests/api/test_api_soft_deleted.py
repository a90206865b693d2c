"""Soft-deleted servers (Nova's deferred delete, vm_state ``soft-delete``) are listed as
Nova's ``instance_get_all_by_filters_sort`` lists them, on both paths: a normal listing
leaves them out, ``deleted=true`` lists them with the deleted ones, so
``status=SOFT_DELETED`` alone lists nothing; changes (``changes-since``) include them.

The ``soft_deleted`` filter, as Nova reads it: ``_get_servers`` passes it (in its query
schema; an administrator's option, dropped for members by ``remove_invalid_options``) to
the database layer as the string given, last value wins; ``instance_get_all_by_filters_sort``
then reads it as a Python truth value beside the ``deleted`` filter: with ``deleted``
false (explicit, or the default when no ``changes-since``/``changes-before`` is given) a
true ``soft_deleted`` adds the soft-deleted servers; with ``deleted`` true an empty one
leaves them out; with no ``deleted`` filter at all it does nothing. Any non-empty string
(``false`` and ``0`` included) is true. Cellsight refused the parameter with a 400.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cellsight.api.headers import PATH
from cellsight.cells.schema import instances
from tests.support.api_world import ADMIN, World, both_paths, build_world, project_tokens

PATHS = ("index", "fanout")
V275 = {"OpenStack-API-Version": "compute 2.75"}


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


def listed(
    client: TestClient, path: str, query: str, headers: dict[str, str] | None = None
) -> set[str]:
    url = f"/v2.1/servers/detail?limit=1000&all_tenants=1&{query}"
    response = client.get(url, headers={**ADMIN, **(headers or {})})
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


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", ["true", "1", "false", "0", "no", "anything"])
def test_any_non_empty_value_adds_soft_deleted_servers_to_a_normal_listing(
    clients: dict[str, TestClient], soft_world: World, path: str, value: str
) -> None:
    soft = ids(soft_world, deleted=False, soft=True)
    live = ids(soft_world, deleted=False, soft=False)
    assert soft and live
    assert listed(clients[path], path, f"soft_deleted={value}") == live | soft
    assert listed(clients[path], path, f"deleted=false&soft_deleted={value}") == live | soft
    # The status Nova shows them with now lists them.
    assert listed(clients[path], path, f"status=SOFT_DELETED&soft_deleted={value}") == soft


@pytest.mark.parametrize("path", PATHS)
def test_an_empty_value_leaves_them_out_of_deleted_listings(
    clients: dict[str, TestClient], soft_world: World, path: str
) -> None:
    soft = ids(soft_world, deleted=False, soft=True)
    gone = ids(soft_world, deleted=True, soft=False)
    live = ids(soft_world, deleted=False, soft=False)
    assert gone
    assert listed(clients[path], path, "deleted=true&soft_deleted=") == gone
    assert listed(clients[path], path, "deleted=true&soft_deleted=yes") == gone | soft
    assert listed(clients[path], path, "soft_deleted=") == live
    # Repeated: the last value counts (webob's MultiDict, as for every single option).
    assert listed(clients[path], path, "deleted=true&soft_deleted=1&soft_deleted=") == gone
    assert listed(clients[path], path, "soft_deleted=&soft_deleted=1") == live | soft


@pytest.mark.parametrize("path", PATHS)
def test_without_a_deleted_filter_it_does_nothing(
    clients: dict[str, TestClient], soft_world: World, path: str
) -> None:
    """``changes-since`` without ``deleted`` sets no deleted filter in Nova: soft_deleted
    has nothing to modify."""
    since = "changes-since=1970-01-01T00:00:00Z"
    plain = listed(clients[path], path, since)
    assert plain & ids(soft_world, deleted=False, soft=True)
    assert listed(clients[path], path, f"{since}&soft_deleted=") == plain
    assert listed(clients[path], path, f"{since}&soft_deleted=1") == plain
    # With an explicit deleted=false it modifies that filter as without changes-since.
    changed_live = plain & ids(soft_world, deleted=False, soft=False)
    changed_soft = plain & ids(soft_world, deleted=False, soft=True)
    both = listed(clients[path], path, f"{since}&deleted=false&soft_deleted=1")
    assert both == changed_live | changed_soft


def test_for_administrators_at_every_microversion_and_dropped_for_members(
    clients: dict[str, TestClient], soft_world: World
) -> None:
    soft = ids(soft_world, deleted=False, soft=True)
    for path, client in clients.items():
        # In Nova's schema: not an unknown parameter from 2.75 on.
        assert listed(client, path, "soft_deleted=1", V275) & soft == soft
        token = project_tokens(soft_world)[0]
        plain = client.get("/v2.1/servers?limit=1000", headers=token)
        asked = client.get("/v2.1/servers?limit=1000&soft_deleted=1", headers={**token, **V275})
        assert plain.status_code == asked.status_code == 200
        assert asked.json() == plain.json()  # silently dropped, as Nova drops it


def test_both_paths_give_the_same_pages(clients: dict[str, TestClient]) -> None:
    for query in ("soft_deleted=1&limit=7", "deleted=true&soft_deleted=&limit=3"):
        bodies = []
        for client in clients.values():
            response = client.get(f"/v2.1/servers/detail?all_tenants=1&{query}", headers=ADMIN)
            assert response.status_code == 200, response.text
            body = response.json()
            for link in body.get("servers_links", []):
                link["href"] = link["href"].split("?", 1)[1]
            bodies.append(body)
        assert bodies[0] == bodies[1]
