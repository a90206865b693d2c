"""Tenant isolation: a project member never sees, nor learns of, another project's
instances, on either path: not in results, not through a marker, not through 404
versus 400, not through counts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.api_world import (
    ADMIN,
    World,
    both_paths,
    project_tokens,
)


@pytest.fixture(scope="module")
def paths(
    sqlite_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestClient]]:
    with both_paths(sqlite_world, tmp_path_factory.mktemp("isolation"), "iso") as clients:
        yield clients


@pytest.fixture(scope="module")
def tenants(sqlite_world: World) -> dict[str, Any]:
    rows = [row for _, row in sqlite_world.rows()]
    token = project_tokens(sqlite_world)[0]
    project = token["X-Auth-Token"].split(":")[1]
    mine = [r for r in rows if r["project_id"] == project]
    theirs = [r for r in rows if r["project_id"] != project]
    return {
        "token": token,
        "project": project,
        "mine": {r["uuid"] for r in mine},
        "mine_live": {r["uuid"] for r in mine if not (r["deleted"] or r["forthcoming"])},
        "theirs": [r["uuid"] for r in theirs],
        "theirs_deleted": [r["uuid"] for r in theirs if r["deleted"]],
        "other_project": theirs[0]["project_id"],
        "other_user": theirs[0]["user_id"],
    }


def listed(
    client: TestClient, token: dict[str, str], params: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    response = client.get(f"/v2.1/servers/detail?{urlencode(params)}", headers=token)
    assert response.status_code == 200, response.text
    return response.json()["servers"]


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_a_member_lists_exactly_their_own_project(
    paths: dict[str, TestClient], tenants: dict[str, Any], path: str
) -> None:
    servers = listed(paths[path], tenants["token"], [])
    assert {s["id"] for s in servers} == tenants["mine_live"]
    assert {s["tenant_id"] for s in servers} == {tenants["project"]}
    since = listed(paths[path], tenants["token"], [("changes-since", "2000-01-01T00:00:00Z")])
    assert {s["id"] for s in since} <= tenants["mine"]


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_filters_never_reach_another_project(
    paths: dict[str, TestClient], tenants: dict[str, Any], path: str
) -> None:
    client, token = paths[path], tenants["token"]
    for params in (
        [("uuid", tenants["theirs"][0])],
        [("user_id", tenants["other_user"])],
        [("name", ".*")],
        [("changes-since", "1970-01-01T00:00:00Z"), ("uuid", tenants["theirs_deleted"][0])],
    ):
        assert {s["id"] for s in listed(client, token, params)} <= tenants["mine"], params


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_a_foreign_marker_is_answered_like_an_unknown_one(
    paths: dict[str, TestClient], tenants: dict[str, Any], path: str
) -> None:
    client, token = paths[path], tenants["token"]
    foreign, unknown = tenants["theirs"][0], str(uuid.uuid4())
    a = client.get(f"/v2.1/servers?marker={foreign}", headers=token)
    b = client.get(f"/v2.1/servers?marker={unknown}", headers=token)
    assert a.status_code == b.status_code == 400
    assert a.json()["badRequest"]["message"].replace(foreign, "X") == b.json()["badRequest"][
        "message"
    ].replace(unknown, "X")
    assert a.headers.keys() == b.headers.keys() or set(a.headers) ^ set(b.headers) <= {
        "content-length"
    }


def test_show_of_a_foreign_server_is_a_plain_404(
    paths: dict[str, TestClient], tenants: dict[str, Any]
) -> None:
    client, token = paths["fanout"], tenants["token"]
    foreign, unknown = tenants["theirs"][0], str(uuid.uuid4())
    a = client.get(f"/v2.1/servers/{foreign}", headers=token)
    b = client.get(f"/v2.1/servers/{unknown}", headers=token)
    assert a.status_code == b.status_code == 404
    assert a.json()["itemNotFound"]["message"].replace(foreign, "X") == b.json()["itemNotFound"][
        "message"
    ].replace(unknown, "X")
    mine = sorted(tenants["mine_live"])[0]
    shown = client.get(f"/v2.1/servers/{mine}", headers=token)
    assert shown.status_code == 200 and shown.json()["server"]["id"] == mine


@pytest.mark.parametrize(
    ("params", "version"),
    [
        ([("all_tenants", "1")], "2.1"),
        ([("all_tenants", "")], "2.1"),
        ([("sort_key", "host")], "2.1"),
        ([("sort_key", "node")], "2.1"),
        ([("status", "DELETED")], "2.1"),
        ([("status", "deleted")], "2.96"),
    ],
)
def test_nova_forbids_members_only_these(
    paths: dict[str, TestClient],
    tenants: dict[str, Any],
    params: list[tuple[str, str]],
    version: str,
) -> None:
    response = paths["fanout"].get(
        f"/v2.1/servers?{urlencode(params)}",
        headers={**tenants["token"], "OpenStack-API-Version": f"compute {version}"},
    )
    assert response.status_code == 403, response.text
    assert response.json()["forbidden"]["message"]


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_vm_state_deleted_is_a_plain_filter(
    paths: dict[str, TestClient], tenants: dict[str, Any], path: str
) -> None:
    """Nova lists deleted servers for the deleted *status* only (``_get_servers``
    compares the status-made list with ``['deleted']``; a ``vm_state`` parameter is a
    string there): ``vm_state=deleted`` filters a normal listing, which holds no deleted
    server, for a member (from 2.83) and an administrator alike."""
    member = {**tenants["token"], "OpenStack-API-Version": "compute 2.83"}
    for query, headers in (("", member), ("&all_tenants=1", ADMIN)):
        response = paths[path].get(f"/v2.1/servers?vm_state=deleted{query}", headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["servers"] == []
    listed = paths[path].get("/v2.1/servers?vm_state=deleted&deleted=true&all_tenants=1",
                             headers=ADMIN)  # fmt: skip
    assert listed.status_code == 200 and listed.json()["servers"]


@pytest.mark.parametrize("path", ["index", "fanout"])
@pytest.mark.parametrize(
    ("params", "version"),
    [
        ([("deleted", "true")], "2.1"),
        ([("deleted", "False")], "2.96"),
        ([("project_id", "x")], "2.1"),
        ([("tenant_id", "x")], "2.96"),
        ([("host", "h")], "2.1"),
        ([("node", "n")], "2.96"),
        ([("uuid", "x")], "2.96"),
        ([("vm_state", "deleted")], "2.82"),  # vm_state is not a member's option before 2.83
        ([("changes-before", "2000-01-01T00:00:00Z")], "2.65"),
        ([("instance_name", "x")], "2.1"),  # not in Nova's schema: stripped before 2.75
    ],
)
def test_options_a_member_may_not_use_are_dropped(
    paths: dict[str, TestClient],
    tenants: dict[str, Any],
    params: list[tuple[str, str]],
    version: str,
    path: str,
) -> None:
    """Nova's ``remove_invalid_options``: the listing is as if they were not sent."""
    headers = {**tenants["token"], "OpenStack-API-Version": f"compute {version}"}
    response = paths[path].get(f"/v2.1/servers/detail?{urlencode(params)}", headers=headers)
    assert response.status_code == 200, response.text
    assert {s["id"] for s in response.json()["servers"]} == tenants["mine_live"]


def test_a_members_option_from_its_microversion_on_is_applied(
    paths: dict[str, TestClient], tenants: dict[str, Any]
) -> None:
    mine = sorted(tenants["mine_live"])
    before = {**tenants["token"], "OpenStack-API-Version": "compute 2.82"}
    after = {**tenants["token"], "OpenStack-API-Version": "compute 2.83"}
    query = "vm_state=no-such-state"
    dropped = paths["fanout"].get(f"/v2.1/servers?{query}", headers=before)
    applied = paths["fanout"].get(f"/v2.1/servers?{query}", headers=after)
    assert sorted(s["id"] for s in dropped.json()["servers"]) == mine
    assert applied.status_code == 200 and applied.json()["servers"] == []


def test_unknown_parameters_are_refused_from_2_75(
    paths: dict[str, TestClient], tenants: dict[str, Any]
) -> None:
    headers = {**tenants["token"], "OpenStack-API-Version": "compute 2.75"}
    response = paths["fanout"].get("/v2.1/servers?instance_name=x", headers=headers)
    assert response.status_code == 400 and "instance_name" in response.text


def test_all_tenants_false_is_allowed_and_still_scoped(
    paths: dict[str, TestClient], tenants: dict[str, Any]
) -> None:
    servers = listed(paths["fanout"], tenants["token"], [("all_tenants", "0")])
    assert {s["id"] for s in servers} == tenants["mine_live"]


def test_another_projects_url_is_rejected(
    paths: dict[str, TestClient], tenants: dict[str, Any]
) -> None:
    client, token = paths["fanout"], tenants["token"]
    bad = client.get(f"/v2.1/{tenants['other_project']}/servers", headers=token)
    assert bad.status_code == 400
    good = client.get(f"/v2.1/{tenants['project']}/servers/detail", headers=token)
    assert good.status_code == 200
    assert all(
        f"/v2.1/{tenants['project']}/servers/" in s["links"][0]["href"]
        for s in good.json()["servers"]
    )


def test_members_detail_has_no_admin_attributes(
    paths: dict[str, TestClient], tenants: dict[str, Any]
) -> None:
    servers = listed(paths["index"], tenants["token"], [])
    assert servers
    for server in servers:
        assert not [k for k in server if k.startswith("OS-EXT-SRV-ATTR:")]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    params=st.lists(
        st.sampled_from(
            [
                ("name", "."),
                ("status", "ACTIVE"),
                ("status", "SHUTOFF"),
                ("changes-since", "2000-01-01T00:00:00Z"),
                ("changes-before", "2100-01-01T00:00:00Z"),
                ("sort_key", "display_name"),
                ("sort_key", "project_id"),
                ("sort_dir", "asc"),
                ("limit", "3"),
                ("tags-any", "prod,dev"),
                ("not-tags", "prod"),
                ("locked", "false"),
            ]
        ),
        max_size=4,
    ),
    path=st.sampled_from(["index", "fanout"]),
)
def test_no_request_of_a_member_returns_anything_foreign(
    paths: dict[str, TestClient], tenants: dict[str, Any], params: list[tuple[str, str]], path: str
) -> None:
    response = paths[path].get(
        f"/v2.1/servers/detail?{urlencode(params)}", headers=tenants["token"]
    )
    if response.status_code == 400:  # more sort_dir than sort_key: nothing to leak
        assert "sort_dir" in response.json()["badRequest"]["message"]
        return
    assert response.status_code == 200
    for server in response.json()["servers"]:
        assert server["id"] in tenants["mine"] and server["tenant_id"] == tenants["project"]
