"""Query v2 over HTTP: every operator on the index and the fan-out path (same data, and
the data the filter's semantics select), direct lookups, statuses 1 and 3, nodes."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cellsight.api.headers import PATH
from cellsight.api.query2 import instances
from cellsight.api.query2.fields import REGISTRY
from tests.support.api_world import World
from tests.support.query2_world import (
    Pair,
    expected_uuids,
    make_pair,
    node_documents,
    query,
)

ALL = list(REGISTRY["instance"])
NODE_ALL = list(REGISTRY["node"])


def _median(docs: list[dict[str, Any]], field: str) -> str:
    values = sorted(d[field] for d in docs if d[field] is not None)
    return str(values[len(values) // 2])


def filters(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One filter per operator, from values the world holds."""
    tags = sorted({t for d in docs for t in d.get("tags") or []})
    mid_created = datetime.fromisoformat(_median(docs, "created_at")).timestamp()
    return {
        "==": ["==", "state", "stopped"],
        "=": ["=", "flavor_name", _median(docs, "flavor_name")],
        "!=": ["!=", "task_state", "rebooting_hard"],
        "<": ["<", "created_at", mid_created],
        "<=": ["<=", "flavor_vcpus", 2],
        ">": [">", "flavor_memory_mb", 2048],
        ">=": [">=", "updated_at", _median(docs, "updated_at")],
        "=~": ["=~", "name", "^[a-m].*-[0-9]"],
        "=[]": ["=[]", "tags", tags[len(tags) // 2]],
        "?": ["?", "key_name"],
        "!": ["!", ["?", "locked"]],
        "&": ["&", ["==", "state", "active"], [">", "flavor_vcpus", 1]],
        "|": ["|", ["==", "power_state", "crashed"], ["=~", "ip4", "^10\\.1"]],
        "status": ["==", "status", "HARD_REBOOT"],
        "deleted": ["==", "deleted", True],
        "list-regex": ["=~", "ip6", ":"],
        "none": None,
    }


@pytest.mark.parametrize(
    "label",
    [
        "==", "=", "!=", "<", "<=", ">", ">=", "=~", "=[]", "?", "!", "&", "|",
        "status", "deleted", "list-regex", "none",
    ],
)  # fmt: skip
def test_each_operator_same_data_on_both_paths(
    pair: Pair, docs: list[dict[str, Any]], label: str
) -> None:
    raw = filters(docs)[label]
    want = expected_uuids("instance", docs, raw)
    assert want, f"the world has no instance for {label}: the test would prove nothing"
    bodies = {}
    for client, path in ((pair.index, "index"), (pair.fanout, "fanout")):
        response = query(client, "instance", {"fields": ALL, "filter": raw})
        assert response.status_code == 200, response.text
        assert response.headers[PATH] == path
        bodies[path] = response.json()
    assert bodies["index"] == bodies["fanout"]
    data = bodies["index"]["data"]
    assert [row[0][1] for row in data] == want
    assert all(len(row) == len(ALL) for row in data)
    assert all(status == 0 or value is None for row in data for status, value in row)


def test_a_lookup_answers_as_the_paths_do(pair: Pair, docs: list[dict[str, Any]]) -> None:
    named = ["|", ["==", "name", "dup-name"], ["==", "uuid", docs[0]["uuid"]]]
    walked = ["&", named, ["?", "uuid"]]  # the same rows, but not a lookup's shape
    want = expected_uuids("instance", docs, named)
    assert len(want) > 1
    for client in pair.both():
        lookup = query(client, "instance", {"fields": ALL, "filter": named})
        walk = query(client, "instance", {"fields": ALL, "filter": walked})
        assert lookup.headers[PATH] == "lookup" and walk.headers[PATH] != "lookup"
        assert lookup.json() == walk.json()
        assert [r[0][1] for r in lookup.json()["data"]] == want


def test_rows_are_the_documents_values(pair: Pair, docs: list[dict[str, Any]]) -> None:
    body = query(pair.fanout, "instance", {"fields": ["uuid", "created_at", "tags", "status"]})
    by_uuid = {d["uuid"]: d for d in docs}
    for (_, uuid), created, tags, status in body.json()["data"]:
        doc = by_uuid[uuid]
        assert created == [0, datetime.fromisoformat(doc["created_at"]).timestamp()]
        assert tags == ([0, doc["tags"]] if doc["tags"] is not None else [3, None])
        assert status[0] == 0 and status[1].isupper()


def test_a_walk_of_small_pages_equals_one_page(world: World, pair: Pair, tmp_path: Path) -> None:
    small = make_pair(tmp_path, world, max_limit=7)
    try:
        for big, little in zip(pair.both(), small.both(), strict=True):
            body = {"fields": ALL, "filter": ["|", ["?", "locked"], ["=~", "name", "e"]]}
            assert query(big, "instance", body).json() == query(little, "instance", body).json()
    finally:
        small.close()


def test_too_many_rows_is_a_400(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "MAX_ROWS", 5)
    for client in pair.both():
        response = query(client, "instance", {"fields": ["uuid"], "filter": None})
        assert response.status_code == 400
        assert "more than 5 instances" in response.json()["badRequest"]["message"]


# Statuses of a read-only world: 1 unknown field, 3 unavailable ------------------------


def test_unknown_field_is_status_1(pair: Pair) -> None:
    for client in pair.both():
        body = query(client, "instance", {"fields": ["uuid", "no.such"]}).json()
        assert body["fields"][1] == {
            "name": "no.such",
            "title": "no.such",
            "kind": "unknown",
            "doc": "Unknown field",
        }
        assert body["data"] and all(row[1] == [1, None] for row in body["data"])


def test_forthcoming_instance_without_a_host_is_status_3(
    pair: Pair, docs: list[dict[str, Any]]
) -> None:
    forthcoming = sorted(d["uuid"] for d in docs if d["forthcoming"] and not d["deleted"])
    assert forthcoming
    raw = ["==", "forthcoming", True]
    for client in pair.both():
        data = query(client, "instance", {"fields": ["uuid", "host", "launched_at"], "filter": raw})
        assert data.json()["data"] == [[[0, u], [3, None], [3, None]] for u in forthcoming]


def test_not_applicable_values_are_status_3(pair: Pair, docs: list[dict[str, Any]]) -> None:
    live = [d for d in docs if d["state"] == "active" and d["terminated_at"] is None]
    assert live
    raw = ["==", "uuid", live[0]["uuid"]]
    for client in pair.both():
        data = query(client, "instance", {"fields": ["terminated_at", "state"], "filter": raw})
        assert data.json()["data"] == [[[3, None], [0, "active"]]]


# Nodes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [">", "memory_mb_used", 0],
        ["=~", "hypervisor_hostname", "1\\."],
        ["!", ["?", "offline"]],
    ],
)
def test_nodes_same_on_both_paths(pair: Pair, world: World, raw: Any) -> None:
    want = expected_uuids("node", node_documents(world), raw)
    assert want
    bodies = {}
    for client, path in ((pair.index, "index"), (pair.fanout, "fanout")):
        response = query(client, "node", {"fields": NODE_ALL, "filter": raw})
        assert response.status_code == 200 and response.headers[PATH] == path
        bodies[path] = response.json()
    assert bodies["index"] == bodies["fanout"]
    assert [row[0][1] for row in bodies["index"]["data"]] == want
    assert json.dumps(bodies["index"])  # plain JSON all the way


def test_derived_node_fields_on_both_paths(pair: Pair, world: World) -> None:
    """``name``, ``cell`` and ``memory_mb_free`` are in no document: each snapshot adds
    them, from the index or the cells alike, and filters see them like stored fields."""
    docs = {d["uuid"]: d for d in node_documents(world)}
    cell_names = {c.uuid: c.name for c in world.registry.list_cells()}
    free = {u: d["memory_mb"] - d["memory_mb_used"] for u, d in docs.items()}
    middle = sorted(free.values())[len(free) // 2]
    fields = ["uuid", "name", "cell", "memory_mb_free"]
    bodies = {}
    for client, path in ((pair.index, "index"), (pair.fanout, "fanout")):
        listing = query(client, "node", {"fields": fields}).json()
        chosen = query(
            client, "node", {"fields": ["uuid"], "filter": [">", "memory_mb_free", middle]}
        )
        bodies[path] = (listing, chosen.json())
    assert bodies["index"] == bodies["fanout"]
    listing, chosen = bodies["index"]
    assert len(listing["data"]) == len(docs)
    for (_, uuid), (_, name), (_, cell), (status, value) in listing["data"]:
        doc = docs[uuid]
        assert name == doc["hypervisor_hostname"] and cell == cell_names[doc["cell_uuid"]]
        assert (status, value) == ((4, None) if doc["offline"] else (0, free[uuid]))
    want = sorted(u for u, d in docs.items() if free[u] > middle)
    assert "data" in chosen, chosen
    assert want and [row[0][1] for row in chosen["data"]] == want


def test_one_regex_bound_for_both_apis(pair: Pair) -> None:
    """Query v2 took 256 characters where the server list (and the README) say 255."""
    from cellsight.api.param_values import MAX_REGEX_LENGTH
    from tests.support.api_world import ADMIN

    for client in pair.both():
        for length, code in ((MAX_REGEX_LENGTH, 200), (MAX_REGEX_LENGTH + 1, 400)):
            pattern = "x" * length
            body = {"fields": ["uuid"], "filter": ["=~", "name", pattern]}
            got = query(client, "instance", body)
            listed = client.get(f"/v2.1/servers?all_tenants=1&name={pattern}", headers=ADMIN)
            assert (got.status_code, listed.status_code) == (code, code), (got.text, listed.text)
    assert MAX_REGEX_LENGTH == 255
