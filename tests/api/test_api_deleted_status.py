"""Listing the DELETED status wins over ``deleted=false``, as in Nova.

Nova's ``_get_servers`` converts the ``deleted`` parameter first and then, when the
status asks for deleted servers only (``vm_state == ['deleted']``), sets ``deleted`` to
true for an administrator. ``openstack server list --all-projects --status DELETED``
relies on it: the CLI always sends ``deleted=False``. Cellsight let the parameter win
and answered an empty list on both paths.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cellsight.api.headers import PATH
from tests.support.api_world import (
    ADMIN,
    World,
    both_paths,
    project_tokens,
)


@pytest.fixture(scope="module")
def clients(
    sqlite_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestClient]]:
    with both_paths(sqlite_world, tmp_path_factory.mktemp("deleted-status"), "ds") as clients:
        yield clients


def deleted_ids(world: World) -> set[str]:
    return {r["uuid"] for _, r in world.rows() if r["deleted"]}


@pytest.mark.parametrize("path", ["index", "fanout"])
@pytest.mark.parametrize("value", ["False", "false", "0", "no"])
def test_status_deleted_with_deleted_false_lists_deleted_servers(
    clients: dict[str, TestClient], sqlite_world: World, path: str, value: str
) -> None:
    url = f"/v2.1/servers/detail?limit=1000&status=DELETED&deleted={value}&all_tenants=True"
    response = clients[path].get(url, headers=ADMIN)
    assert (response.status_code, response.headers[PATH]) == (200, path)
    servers = response.json()["servers"]
    assert {s["id"] for s in servers} == deleted_ids(sqlite_world)
    assert {s["status"] for s in servers} == {"DELETED"}


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_a_deleted_value_that_is_no_boolean_is_false_and_the_status_still_wins(
    clients: dict[str, TestClient], sqlite_world: World, path: str
) -> None:
    # Nova: ``bool_from_string(default=False)``, then the DELETED status overrides it.
    url = "/v2.1/servers?status=DELETED&deleted=maybe&all_tenants=1&limit=1000"
    response = clients[path].get(url, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert {s["id"] for s in response.json()["servers"]} == deleted_ids(sqlite_world)


def test_a_member_listing_deleted_status_is_still_forbidden(
    clients: dict[str, TestClient], sqlite_world: World
) -> None:
    token = project_tokens(sqlite_world)[0]
    for client in clients.values():
        response = client.get("/v2.1/servers?status=DELETED&deleted=False", headers=token)
        assert response.status_code == 403


def test_other_statuses_keep_deleted_false(
    clients: dict[str, TestClient], sqlite_world: World
) -> None:
    """Only a status that lists deleted servers alone overrides the parameter (Nova
    compares the vm_states with ``['deleted']``)."""
    url = "/v2.1/servers?limit=1000&status=DELETED&status=ACTIVE&deleted=False&all_tenants=1"
    for client in clients.values():
        listed = {s["id"] for s in client.get(url, headers=ADMIN).json()["servers"]}
        assert listed and not listed & deleted_ids(sqlite_world)


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_unknown_statuses_as_in_nova(clients: dict[str, TestClient], path: str) -> None:
    """Nova's ``task_and_vm_state_from_status`` ignores a status it does not know beside
    one it knows; with none known it answers 400 from 2.38 and an empty list before."""
    client = clients[path]
    base = "/v2.1/servers?limit=1000&all_tenants=1"
    active = client.get(f"{base}&status=ACTIVE", headers=ADMIN).json()["servers"]
    both = client.get(f"{base}&status=ACTIVE&status=BOGUS", headers=ADMIN)
    assert both.status_code == 200 and both.json()["servers"] == active and active
    new = {**ADMIN, "OpenStack-API-Version": "compute 2.38"}
    refused = client.get(f"{base}&status=BOGUS", headers=new)
    assert refused.status_code == 400 and "status" in refused.json()["badRequest"]["message"]
    old = {**ADMIN, "OpenStack-API-Version": "compute 2.37"}
    empty = client.get(f"{base}&status=BOGUS", headers=old)
    assert (empty.status_code, empty.json()) == (200, {"servers": []})
