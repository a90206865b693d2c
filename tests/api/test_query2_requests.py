"""Query v2 requests: the fields call, bad input (400/404 naming the problem) and the
scoping of non-administrators (their project only; 403 for admin-only fields, filters
and node queries), on the index and the fan-out path alike."""

from __future__ import annotations

from typing import Any

import pytest

from cellsight.api.headers import PATH
from cellsight.api.query2.fields import REGISTRY
from tests.support.api_world import World, project_tokens
from tests.support.query2_world import (
    ADMIN,
    Pair,
    expected_uuids,
    query,
)

ALL = list(REGISTRY["instance"])
NODE_ALL = list(REGISTRY["node"])
MEMBER = {"X-Auth-Token": "someone:some-project"}


# The fields call -----------------------------------------------------------------------


def test_fields_call_lists_every_definition(pair: Pair) -> None:
    for resource, names in (("instance", ALL), ("node", NODE_ALL)):
        body = pair.fanout.get(f"/v2.1/query/{resource}/fields", headers=ADMIN).json()
        assert [d["name"] for d in body["fields"]] == names


def test_fields_call_with_names_marks_unknown_ones(pair: Pair) -> None:
    response = pair.index.get("/v2.1/query/instance/fields?fields=name,bogus,uuid", headers=ADMIN)
    got = response.json()["fields"]
    assert [(d["name"], d["kind"]) for d in got] == [
        ("name", "text"),
        ("bogus", "unknown"),
        ("uuid", "text"),
    ]


def test_fields_call_errors(pair: Pair) -> None:
    assert pair.index.get("/v2.1/query/flavor/fields", headers=ADMIN).status_code == 404
    bad = pair.index.get("/v2.1/query/instance/fields?field=name", headers=ADMIN)
    assert bad.status_code == 400 and "field" in bad.json()["badRequest"]["message"]
    assert pair.index.get("/v2.1/query/instance/fields").status_code == 401


# 400s ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filter_", "names"),
    [
        (["==", "colour", "red"], "colour"),
        (["==", "flavor_vcpus", "two"], "flavor_vcpus"),
        (["==", "locked", 1], "locked"),
        (["=~", "name", "(a+)+$"], "name"),
        (["=~", "name", "a(?=b)"], "name"),
        (["~", "name", "x"], "'~'"),
        (["==", "name", "a\u0000b"], "name"),
        (["==", "metadata", "x"], "metadata"),
        # Named as sent, not as the integer a float past 64 bits would have become.
        (["==", "flavor_vcpus", 1e308], "takes a 64-bit integer, not 1e+308"),
        (["==", "flavor_vcpus", 2.0**63], "takes a 64-bit integer, not 9.223372036854776e+18"),
        (5, "list"),
        ("nmae == 1", "column 1: unknown instance field 'nmae'"),  # the text form
    ],
)
def test_bad_filters_are_400_naming_the_problem(pair: Pair, filter_: Any, names: str) -> None:
    for client in pair.both():
        response = query(client, "instance", {"fields": ["uuid"], "filter": filter_})
        assert response.status_code == 400, response.text
        assert names in response.json()["badRequest"]["message"]


def test_too_deep_filter_is_400(pair: Pair) -> None:
    raw: Any = ["==", "name", "a"]
    for _ in range(10):
        raw = ["!", raw]
    response = query(pair.index, "instance", {"fields": ["uuid"], "filter": raw})
    assert response.status_code == 400
    assert "deeper than 10" in response.json()["badRequest"]["message"]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON: nested too deeply"),
        (b'{"fields": [], "filter": [1, 2', "not valid JSON: Expecting ',' delimiter at line 1"),
        (b'{"fields": [], "filter": ' + b"9" * 5001 + b"}", "a number has more than 4300 digits"),
        (b'{"fields": ["\xff"]}', "not valid JSON: it is not UTF-8"),
        (b'["uuid"]', "JSON object"),
        (b'{"fields": "uuid"}', "'fields' must be a list"),
        (b'{"fields": [1]}', "'fields' must be a list"),
        (b'{"filter": null}', "'fields' must be a list"),
        (b'{"fields": [], "sort": "x"}', "Unknown key(s) in the request body: sort"),
        # A lone surrogate named in the fault could not be encoded: the 400 became a 500.
        (b'{"fields": ["uuid"], "\\ud800": 1}', "Unknown key(s) in the request body: \\ud800"),
    ],
)
@pytest.mark.parametrize("resource", ["instance", "node"])
@pytest.mark.parametrize("token", [ADMIN, MEMBER])
def test_bad_bodies_are_400(
    pair: Pair, content: bytes, says: str, resource: str, token: dict[str, str]
) -> None:
    response = pair.index.post(
        f"/v2.1/query/{resource}",
        content=content,
        headers={**token, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert says in response.json()["badRequest"]["message"]
    assert "sys." not in response.text  # CPython's own advice, once quoted cut mid-word


def test_unknown_resource_is_404(pair: Pair) -> None:
    assert query(pair.index, "flavor", {"fields": []}).status_code == 404


# Scoping -------------------------------------------------------------------------------


def test_non_admins_see_only_their_project(
    pair: Pair, world: World, docs: list[dict[str, Any]]
) -> None:
    token = project_tokens(world)[0]
    project = token["X-Auth-Token"].split(":")[1]
    raw = ["|", ["?", "locked"], ["=~", "name", "-"]]
    want = expected_uuids("instance", docs, raw, project=project)
    assert want
    bodies = []
    for client in pair.both():
        response = query(
            client, "instance", {"fields": ["uuid", "tenant_id"], "filter": raw}, token
        )
        assert response.status_code == 200
        data = response.json()["data"]
        assert [r[0][1] for r in data] == want and {r[1][1] for r in data} == {project}
        bodies.append(response.json())
    assert bodies[0] == bodies[1]


def test_non_admins_cannot_look_up_another_projects_instance(
    pair: Pair, world: World, docs: list[dict[str, Any]]
) -> None:
    token = project_tokens(world)[0]
    project = token["X-Auth-Token"].split(":")[1]
    foreign = next(d for d in docs if d["tenant_id"] != project and not d["deleted"])
    own = next(d for d in docs if d["tenant_id"] == project and not d["deleted"])
    raw = ["|", ["==", "uuid", foreign["uuid"]], ["==", "uuid", own["uuid"]]]
    for client in pair.both():
        response = query(client, "instance", {"fields": ["uuid"], "filter": raw}, token)
        assert response.headers[PATH] == "lookup"
        assert response.json()["data"] == [[[0, own["uuid"]]]]
    if foreign["display_name"]:
        by_name = ["==", "name", foreign["display_name"]]
        response = query(
            pair.index, "instance", {"fields": ["tenant_id"], "filter": by_name}, token
        )
        assert all(row == [[0, project]] for row in response.json()["data"])


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"fields": ["uuid", "host"]}, "host are admin-only"),
        ({"fields": ["uuid", "cell_uuid"]}, "cell_uuid are admin-only"),
        ({"fields": ["uuid"], "filter": ["==", "node", "x"]}, "Filtering on node"),
        ({"fields": ["uuid"], "filter": ["==", "tenant_id", "x"]}, "Filtering on tenant_id"),
        ({"fields": ["uuid"], "filter": ["==", "deleted", True]}, "Filtering on deleted"),
    ],
)
def test_admin_only_fields_and_filters_are_403(
    pair: Pair, world: World, body: dict[str, Any], says: str
) -> None:
    token = project_tokens(world)[0]
    response = query(pair.fanout, "instance", body, token)
    assert response.status_code == 403 and says in response.json()["forbidden"]["message"]


def test_node_queries_are_admin_only(pair: Pair, world: World) -> None:
    token = project_tokens(world)[0]
    response = query(pair.index, "node", {"fields": ["uuid"]}, token)
    assert response.status_code == 403 and "admin-only" in response.text
    assert pair.index.get("/v2.1/query/node/fields", headers=token).status_code == 200
