"""Statuses 2 and 4 from real situations, and direct lookups with the index stopped.

Each test builds its own world, since each breaks something: a cell's database made
unreachable, a compute node marked offline, the index's database made unopenable.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.api.headers import PATH, SKIPPED_CELLS, parse_skipped
from cellsight.api.query2.fields import REGISTRY
from cellsight.api.query2.instances import MAPPING_FIELDS
from cellsight.cells.database import connect
from cellsight.cells.reads import list_compute_nodes
from cellsight.cells.schema import compute_nodes, instance_mappings
from tests.support.api_world import ADMIN, World, build_world, project_tokens
from tests.support.query2_world import (
    Pair,
    instance_documents,
    make_pair,
    node_documents,
    query,
    state,
)

ALL = list(REGISTRY["instance"])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path / "world", "sqlite")
    yield w
    w.close()


@pytest.fixture
def pair(world: World, tmp_path: Path) -> Iterator[Pair]:
    p = make_pair(tmp_path / "pair", world, cell_timeout=2.0)
    yield p
    p.close()


def _break_cell(world: World, pair: Pair, name: str) -> str:
    """Make one cell's database unopenable (its file becomes a directory)."""
    cell = next(c for c in world.registry.list_cells() if c.name == name)
    path = Path(sa.make_url(cell.database_url).database or "")
    for client in pair.both():
        state(client).fanout.engines.dispose()  # pooled connections hold the old file
    world.registry.engines.dispose()
    shutil.move(path, path.with_suffix(".gone"))
    path.mkdir()
    return cell.uuid


def _mappings(world: World, cell_uuid: str) -> dict[str, bool]:
    """instance uuid → queued_for_delete, of one cell's instance mappings."""
    m = instance_mappings.c
    query_ = sa.select(m.instance_uuid, m.queued_for_delete).where(m.cell_uuid == cell_uuid)
    with connect(world.registry.api_engine) as conn:
        return {u: bool(q) for u, q in conn.execute(query_)}


def test_instances_of_a_skipped_cell_have_status_2(world: World, pair: Pair) -> None:
    docs = instance_documents(world)
    dead = _break_cell(world, pair, "cell2")
    # What the mappings say of the dead cell's instances is all there is to go on.
    in_dead = sorted(u for u, queued in _mappings(world, dead).items() if not queued)
    alive = sorted(d["uuid"] for d in docs if d["cell_uuid"] != dead and not d["deleted"])
    response = query(pair.fanout, "instance", {"fields": ["uuid", "name", "cell_uuid", "host"]})
    assert response.status_code == 200
    assert response.headers[PATH] == "fanout"
    assert [(name, uuid) for name, uuid, _ in parse_skipped(response.headers[SKIPPED_CELLS])] == [
        ("cell2", dead)
    ]
    rows = {row[0][1]: row for row in response.json()["data"]}
    assert sorted(rows) == sorted(in_dead + alive)
    for uuid in in_dead:
        assert rows[uuid][1:] == [[2, None], [0, dead], [2, None]]
    assert all(rows[u][1][0] in (0, 3) for u in alive)


def test_a_skipped_cell_only_shows_what_the_filter_surely_selects(world: World, pair: Pair) -> None:
    docs = instance_documents(world)
    dead = _break_cell(world, pair, "cell3")
    victim = next(d for d in docs if d["cell_uuid"] == dead and not d["deleted"])
    token = {"X-Auth-Token": f"u:{victim['tenant_id']}"}
    # By uuid (a lookup): the mapping decides, so the row is there, with no data.
    by_uuid = {"fields": ["uuid", "tenant_id", "state"], "filter": ["==", "uuid", victim["uuid"]]}
    response = query(pair.fanout, "instance", by_uuid, token)
    assert response.headers[PATH] == "lookup" and SKIPPED_CELLS in response.headers
    assert response.json()["data"] == [[[0, victim["uuid"]], [0, victim["tenant_id"]], [2, None]]]
    # By state: the mapping cannot decide, so the dead cell's instances are left out.
    by_state = {"fields": ["uuid"], "filter": ["==", "state", victim["state"]]}
    response = query(pair.fanout, "instance", by_state, token)
    uuids = {row[0][1] for row in response.json()["data"]}
    assert victim["uuid"] not in uuids
    assert all(d["cell_uuid"] != dead for d in docs if d["uuid"] in uuids)


def test_the_index_path_has_no_skipped_cells(world: World, pair: Pair) -> None:
    _break_cell(world, pair, "cell2")
    response = query(pair.index, "instance", {"fields": ["uuid", "name"]})
    assert response.headers[PATH] == "index" and SKIPPED_CELLS not in response.headers
    assert all(row[1][0] != 2 for row in response.json()["data"])


def _set_offline(world: World, node: dict[str, Any], *, revision: bool = False) -> None:
    """Offline in the cell by plain SQL; with ``revision``, as an operation does it."""
    cell = next(c for c in world.registry.list_cells() if c.uuid == node["cell_uuid"])
    c = compute_nodes.c
    bump = {"revision": c.revision + 1} if revision else {}
    with world.registry.cell_engine(cell).begin() as conn:
        conn.execute(
            compute_nodes.update().where(c.uuid == node["uuid"]).values(offline=True, **bump)
        )


def _busiest_node(world: World) -> dict[str, Any]:
    docs = instance_documents(world)
    counts: dict[tuple[str, str], int] = {}
    for d in docs:
        if d["host"] and not d["deleted"]:
            counts[(d["host"], d["node"])] = counts.get((d["host"], d["node"]), 0) + 1
    host, node = max(counts, key=lambda k: counts[k])
    nodes = node_documents(world)
    return next(n for n in nodes if n["host"] == host and n["hypervisor_hostname"] == node)


def test_an_offline_node_reports_status_4(world: World, pair: Pair) -> None:
    node = _busiest_node(world)
    _set_offline(world, node)
    fields = ["uuid", "host", "offline", "memory_mb", "vcpus_used", "local_gb"]
    raw = ["==", "uuid", node["uuid"]]
    response = query(pair.fanout, "node", {"fields": fields, "filter": raw})
    assert response.json()["data"] == [
        [[0, node["uuid"]], [0, node["host"]], [0, True], [4, None], [4, None], [4, None]]
    ]
    # The instances on it: their power state is the node's to tell.
    on_node = ["&", ["==", "host", node["host"]], ["==", "node", node["hypervisor_hostname"]]]
    body = query(
        pair.fanout, "instance", {"fields": ["uuid", "power_state", "state"], "filter": on_node}
    )
    data = body.json()["data"]
    assert data and all(row[1] == [4, None] and row[2][0] == 0 for row in data)
    elsewhere = query(
        pair.fanout, "instance", {"fields": ["power_state"], "filter": ["!", on_node]}
    )
    assert all(row[0][0] in (0, 3) for row in elsewhere.json()["data"])
    # An authorization probe: to a member, whose servers these may be, a host being down
    # is not told (Nova's host_status policies are administrators'): as last reported.
    ids = [["==", "uuid", row[0][1]] for row in data]
    seen = []
    for token in project_tokens(world):
        own = query(
            pair.fanout,
            "instance",
            # By uuid: members may not filter on a host.
            {"fields": ["uuid", "power_state"], "filter": ["|", *ids]},
            token,
        ).json()["data"]
        assert all(row[1][0] == 0 for row in own), own
        seen.extend(own)
    assert sorted(row[0][1] for row in seen) == sorted(row[0][1] for row in data)


def test_node_state_is_cached_then_refreshed(
    world: World, pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _busiest_node(world)
    client = pair.fanout
    body = {"fields": ["offline"], "filter": ["==", "uuid", node["uuid"]]}
    assert query(client, "node", body).json()["data"] == [[[0, False]]]
    _set_offline(world, node)
    # Within the TTL the cached state answers; the cache is what queries read.
    assert query(client, "node", body).json()["data"] == [[[0, False]]]
    cache = state(client).node_cache
    assert cache.loads == 1
    cache.ttl = 0.0  # expire it
    assert query(client, "node", body).json()["data"] == [[[0, True]]]
    assert cache.loads == 2


def _stop_index(pair: Pair) -> None:
    """The embedded index's database becomes unopenable: the engine is down."""
    pair.engine.close()
    path = pair.engine.path
    shutil.move(path, path.with_suffix(".gone"))
    path.mkdir()


def test_lookup_answers_without_touching_the_index(world: World, pair: Pair) -> None:
    docs = [d for d in instance_documents(world) if not d["deleted"]]
    first, second = docs[0], docs[-1]
    before = query(pair.index, "instance", {"fields": ALL, "filter": ["==", "uuid", first["uuid"]]})
    assert before.headers[PATH] == "lookup"
    _stop_index(pair)
    raw = ["|", ["==", "uuid", first["uuid"]], ["==", "name", second["display_name"]]]
    response = query(pair.index, "instance", {"fields": ALL, "filter": raw})
    assert response.status_code == 200 and response.headers[PATH] == "lookup"
    got = {row[0][1] for row in response.json()["data"]}
    assert {first["uuid"], second["uuid"]} <= got
    safe = state(pair.index).safe_connect
    assert not safe.flagged, "a lookup touched the index"
    one = query(pair.index, "instance", {"fields": ALL, "filter": ["==", "uuid", first["uuid"]]})
    assert one.json() == before.json()
    # Any other query tries the index, finds it stopped, and answers from the cells.
    walk = query(pair.index, "instance", {"fields": ["uuid"], "filter": ["?", "uuid"]})
    assert walk.status_code == 200 and walk.headers[PATH] == "fanout" and safe.flagged


def test_nodes_fall_back_to_the_cells_when_the_index_stops(world: World, pair: Pair) -> None:
    body = {"fields": list(REGISTRY["node"])}
    from_index = query(pair.index, "node", body)
    assert from_index.headers[PATH] == "index"
    _stop_index(pair)
    state(pair.index).node_cache.invalidate()
    from_cells = query(pair.index, "node", body)
    assert from_cells.status_code == 200 and from_cells.headers[PATH] == "fanout"
    assert from_cells.json() == from_index.json()


def test_placeholders_are_scoped_to_the_project(world: World, pair: Pair) -> None:
    token = project_tokens(world)[0]
    project = token["X-Auth-Token"].split(":")[1]
    docs = instance_documents(world)
    dead = _break_cell(world, pair, "cell1")
    queued = _mappings(world, dead)
    mine = sorted(
        d["uuid"]
        for d in docs
        if d["cell_uuid"] == dead and d["tenant_id"] == project and not queued[d["uuid"]]
    )
    assert mine, "the project must have instances in the broken cell"
    response = query(pair.fanout, "instance", {"fields": ["uuid", "tenant_id", "name"]}, token)
    assert response.status_code == 200
    data = response.json()["data"]
    assert {row[1][1] for row in data} == {project}
    assert sorted(row[0][1] for row in data if row[2][0] == 2) == mine
    assert {"uuid", "tenant_id"} <= MAPPING_FIELDS


def test_nodes_of_a_skipped_cell_are_reported_and_retried(world: World, pair: Pair) -> None:
    dead = _break_cell(world, pair, "cell2")
    want = sorted(n["uuid"] for n in node_documents_alive(world, dead))
    client = pair.fanout
    for loads in (1, 2):  # a partial load is not kept: the next query retries the cell
        response = query(client, "node", {"fields": ["uuid", "cell_uuid"]})
        assert response.status_code == 200
        assert [u for _, u, _ in parse_skipped(response.headers[SKIPPED_CELLS])] == [dead]
        assert [row[0][1] for row in response.json()["data"]] == want
        assert state(client).node_cache.loads == loads


def node_documents_alive(world: World, dead: str) -> list[dict[str, Any]]:
    """The uuids of the nodes of every cell but ``dead``."""
    out: list[dict[str, Any]] = []
    for cell in world.registry.list_cells():
        if cell.uuid == dead:
            continue
        with connect(world.registry.cell_engine(cell)) as conn:
            out.extend({"uuid": r["uuid"]} for r in list_compute_nodes(conn))
    return out


def test_a_deleted_instance_of_a_skipped_cell_is_not_found(world: World, pair: Pair) -> None:
    """An authorization probe: its show at 2.69 was a 200 UNKNOWN record; Nova's
    ``_get_instance_from_cell`` takes an instance queued for delete in a down cell for
    deleted (404), and only a live one gets the minimal record."""
    dead = _break_cell(world, pair, "cell2")
    queued = _mappings(world, dead)
    deleted = next(u for u, q in queued.items() if q)
    live = next(u for u, q in queued.items() if not q)
    v269 = {**ADMIN, "OpenStack-API-Version": "compute 2.69"}
    for client in pair.both():
        gone = client.get(f"/v2.1/servers/{deleted}", headers=v269)
        assert gone.status_code == 404, gone.text
        assert gone.json()["itemNotFound"]["message"] == f"Instance {deleted} could not be found."
        shown = client.get(f"/v2.1/servers/{live}", headers=v269)
        assert shown.status_code == 200 and shown.json()["server"]["status"] == "UNKNOWN"
        old = client.get(f"/v2.1/servers/{deleted}", headers=ADMIN)
        assert old.status_code == 503, old.text  # below 2.69 a down cell is named, as before


def _ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reading of an evaluation's clock is a second later than the one before."""
    from cellsight.api.query2 import evaluate

    ticks = itertools.count()
    monkeypatch.setattr(evaluate, "CLOCK", lambda: float(next(ticks)))


def test_a_filter_evaluated_in_memory_is_bounded_by_search_timeout(
    world: World, pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resource-exhaustion probe: 499 regular expressions on every node (node queries
    are evaluated in memory) held a core for minutes after the client had gone, and on
    the mappings of a skipped cell (a member's query) for half a minute."""

    def costly(n: int) -> list[Any]:
        return ["|", *(["=~", "name", f".?.?.?.?.?.?.?.?.?.?z{i}"] for i in range(n))]

    answered = query(pair.fanout, "node", {"fields": ["name"], "filter": costly(3)})
    assert answered.status_code == 200
    _ticking(monkeypatch)  # search_timeout is 5 s: the sixth node is past it
    assert len(node_documents(world)) > 5
    # Another filter: a repeated one is answered from the snapshot's memo, unevaluated.
    refused = query(pair.fanout, "node", {"fields": ["name"], "filter": costly(4)})
    assert refused.status_code == 400, refused.text
    message = refused.json()["badRequest"]["message"]
    assert "too costly" in message and "ran past 5 s of CPU (5 items read)" in message
    member = project_tokens(world)[0]
    dead = _break_cell(world, pair, "cell2")
    on_uuid = ["|", *(["=~", "uuid", f"^{c}"] for c in "0123456789abcdef")]
    placeholders = query(pair.fanout, "instance", {"fields": ["uuid"], "filter": on_uuid}, member)
    assert placeholders.status_code == 400, placeholders.text
    assert "too costly" in placeholders.json()["badRequest"]["message"]
    monkeypatch.undo()
    answered = query(pair.fanout, "instance", {"fields": ["uuid"], "filter": on_uuid}, member)
    assert answered.status_code == 200 and answered.headers[SKIPPED_CELLS] == "cell;reason=error"
    assert dead  # named to administrators only (the test below)


def test_an_answer_is_bounded_in_values(
    world: World, pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resource-exhaustion probe: the heaviest fields asked for 200 times over 8,462
    instances made a 75 MB body (a dozen at once left the API at 2 GB)."""
    from cellsight.api.routes import query as route

    live = ["!", ["?", "deleted"]]
    n = len(query(pair.index, "instance", {"fields": ["uuid"], "filter": live}).json()["data"])
    assert n > 1
    monkeypatch.setattr(route, "MAX_VALUES", 3 * n)
    for client in pair.both():
        within = query(client, "instance", {"fields": ["uuid"] * 3, "filter": live})
        assert within.status_code == 200 and len(within.json()["data"]) == n
        past = query(client, "instance", {"fields": ["uuid", "name", "uuid", "tags"]})
        assert past.status_code == 400, past.text
        message = past.json()["badRequest"]["message"]
        assert f"would hold {n} items of 4 fields, more than {3 * n:,} values" in message


def test_a_skipped_cell_is_named_to_administrators_only(world: World, pair: Pair) -> None:
    """An authorization probe: members learned the name and uuid of the cell holding
    their servers from the header and the 503s; Nova shows no cell to its users."""
    member = project_tokens(world)[0]
    project = member["X-Auth-Token"].split(":")[1]
    own = next(
        r["uuid"]
        for c, r in world.rows()
        if r["project_id"] == project and not r["deleted"] and c == _cell_uuid(world, "cell2")
    )
    dead = _break_cell(world, pair, "cell2")
    for token, named in ((ADMIN, True), (member, False)):
        listing = pair.fanout.get("/v2.1/servers", headers=token)
        assert listing.status_code == 200
        header = listing.headers[SKIPPED_CELLS]
        assert (dead in header and "cell2" in header) is named, header
        shown = pair.fanout.get(f"/v2.1/servers/{own}", headers=token)
        assert shown.status_code == 503
        assert ("(cell2)" in shown.text) is named, shown.text
        marked = pair.fanout.get(f"/v2.1/servers?marker={own}", headers=token)
        assert marked.status_code == 503
        assert ("(cell2)" in marked.text) is named, marked.text


def _cell_uuid(world: World, name: str) -> str:
    return next(c.uuid for c in world.registry.list_cells() if c.name == name)
