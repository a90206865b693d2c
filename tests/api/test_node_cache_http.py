"""The node cache behind query v2: ``bypass_cache=true`` refills it; the nodes of a cell
that stops answering keep their identity with status 2 for their live fields."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellsight.api.headers import SKIPPED_CELLS
from cellsight.api.query2.nodes import node_cache
from tests.api.test_query2_situations import _break_cell, _set_offline
from tests.support.api_world import World, build_world
from tests.support.query2_world import ADMIN, Pair, make_pair, node_documents, state

FIELDS = ["uuid", "cell_uuid", "host", "offline", "memory_mb", "vcpus_used"]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[World, Pair]]:
    world = build_world(tmp_path / "w", "sqlite")
    pair = make_pair(tmp_path / "p", world)
    yield world, pair
    pair.close()
    world.close()


def nodes(client: Any, *, bypass: str | None = None) -> Any:
    url = "/v2.1/query/node" + (f"?bypass_cache={bypass}" if bypass else "")
    return client.post(url, json={"fields": FIELDS}, headers=ADMIN)


def test_bypass_cache_snapshots_and_refills(setup: tuple[World, Pair]) -> None:
    world, pair = setup
    client = pair.fanout
    node = node_documents(world)[0]
    row = lambda body: next(r for r in body["data"] if r[0][1] == node["uuid"])  # noqa: E731
    assert row(nodes(client).json())[3] == [0, False]
    _set_offline(world, node)
    assert row(nodes(client).json())[3] == [0, False]  # the cache answers (10 min TTL)
    fresh = row(nodes(client, bypass="true").json())
    assert fresh[3] == [0, True] and fresh[4] == [4, None]  # offline: live figures status 4
    assert row(nodes(client).json())[3] == [0, True]  # refilled
    assert state(client).node_cache.loads == 2
    bad = nodes(client, bypass="maybe")
    assert bad.status_code == 400 and "bypass_cache" in bad.json()["badRequest"]["message"]
    get = client.get(
        "/v2.1/query/node", params={"fields": "uuid,offline", "bypass_cache": "1"}, headers=ADMIN
    )
    assert get.status_code == 200 and state(client).node_cache.loads == 3


def test_nodes_of_a_cell_that_stops_answering_are_status_2(setup: tuple[World, Pair]) -> None:
    world, pair = setup
    client = pair.fanout
    before = nodes(client).json()["data"]
    dead = _break_cell(world, pair, "cell2")
    after = nodes(client, bypass="true")
    assert after.status_code == 200 and dead in after.headers[SKIPPED_CELLS]
    data = after.json()["data"]
    assert [r[0] for r in data] == [r[0] for r in before]  # the same nodes, by uuid
    for row in data:
        if row[1][1] == dead:
            assert row[2][0] == 0 and row[4] == [2, None] and row[5] == [2, None]
        else:
            assert row[4][0] in (0, 4)


def test_a_dropped_node_is_read_from_its_cell_not_the_lagging_index(
    setup: tuple[World, Pair],
) -> None:
    """An operation or a node notification drops a node's entry before the indexer has
    written the change: the next request read the cell's nodes from the index and kept
    the old state for a whole TTL (an adversarial probe). It reads that cell's database;
    the other cell stays cached."""
    world, pair = setup
    client = pair.index
    node = node_documents(world)[0]
    row = lambda body: next(r for r in body["data"] if r[0][1] == node["uuid"])  # noqa: E731
    assert row(nodes(client).json())[3] == [0, False]
    cache = state(client).node_cache
    assert cache.get().source == "index"
    _set_offline(world, node, revision=True)  # in the cell; no indexer runs: the index lags
    cache.invalidate_node(node["uuid"], node["cell_uuid"])  # what the operation does
    loads = cache.loads
    assert row(nodes(client).json())[3] == [0, True]
    assert cache.loads == loads + 1
    # One cell read again, from its database; the other answered from memory.
    assert cache.get().source == "cells" and cache.loads == loads + 1
    # The cell's next read, once its entries expire or are warmed, is the index's again;
    # an entry newer than the index's document (its revision) stays until the index has it.
    cache.warm()
    assert cache.get().source == "index"
    assert row(nodes(client).json())[3] == [0, True]


def test_a_node_changed_before_its_cell_was_first_read_is_read_from_the_cell(
    setup: tuple[World, Pair],
) -> None:
    """A probe: an API just started (its cache cold) reserved on a node, and its first node
    query read that cell from the lagging index and kept the old figures for a TTL."""
    world, pair = setup
    client = pair.index
    node = node_documents(world)[0]
    cache = node_cache(state(client))  # made as an operation makes it: no query yet
    _set_offline(world, node, revision=True)  # in the cell; no indexer runs: the index lags
    cache.invalidate_node(node["uuid"], node["cell_uuid"])  # what the operation does
    row = next(r for r in nodes(client).json()["data"] if r[0][1] == node["uuid"])
    assert row[3] == [0, True]
    cache.warm()  # the cell's next read is the index's again; the newer entry stands
    assert cache.get().source == "index"
    row = next(r for r in nodes(client).json()["data"] if r[0][1] == node["uuid"])
    assert row[3] == [0, True]


def test_a_dropped_node_of_a_cell_that_does_not_answer_is_read_from_the_index(
    setup: tuple[World, Pair],
) -> None:
    """The cell's own read fails: its nodes come from the index, as before any drop,
    rather than be left out of the answer."""
    world, pair = setup
    client = pair.index
    before = nodes(client).json()["data"]
    cell2 = next(c.uuid for c in world.registry.list_cells() if c.name == "cell2")
    node = next(n for n in node_documents(world) if n["cell_uuid"] == cell2)
    dead = _break_cell(world, pair, "cell2")
    state(client).node_cache.invalidate_node(node["uuid"], dead)
    after = nodes(client)
    assert after.status_code == 200 and SKIPPED_CELLS not in after.headers
    assert after.json()["data"] == before


def test_bypass_reads_the_cells_when_the_index_serves_nodes(setup: tuple[World, Pair]) -> None:
    """``bypass_cache=true`` is a snapshot of the cells, not of the index: a change the
    indexer has not written yet is seen, and a cell whose database does not answer is
    named though the index still lists its nodes (a probe: it was reported as answering)."""
    world, pair = setup
    client = pair.index
    node = node_documents(world)[0]
    row = lambda body: next(r for r in body["data"] if r[0][1] == node["uuid"])  # noqa: E731
    assert row(nodes(client).json())[3] == [0, False]
    assert state(client).node_cache.get().source == "index"
    _set_offline(world, node, revision=True)  # in the cell; no indexer: the index lags
    assert row(nodes(client, bypass="true").json())[3] == [0, True]
    assert state(client).node_cache.get().source == "cells"
    before = nodes(client).json()["data"]
    cell2 = next(c.uuid for c in world.registry.list_cells() if c.name == "cell2")
    dead = _break_cell(world, pair, "cell2")
    assert dead == cell2
    after = nodes(client, bypass="true")
    assert after.status_code == 200 and dead in after.headers[SKIPPED_CELLS]
    data = after.json()["data"]
    assert [r[0] for r in data] == [r[0] for r in before]  # listed, from the index
    assert all(r[4] == [2, None] for r in data if r[1][1] == dead)
    summary = client.post("/v2.1/os-cellsight/nodes/refresh", headers=ADMIN).json()
    assert summary["source"] == "cells" and summary["skipped_cells"] == ["cell2"]
