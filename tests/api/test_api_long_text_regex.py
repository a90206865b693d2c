"""A regex filter over long text, on both paths. Found from outside: ``a*a*b`` passes
the subset's checks, and on a description of a few thousand characters (a text field
holds 64 KiB) Python's ``re`` ran for minutes (17 s on 4,000). The fan-out named every
SQLite cell a timeout (one uninterruptible match held the others' threads), and the index path's
search ran past its deadline, which switched the whole API to the fan-out. Values
past a name's length are now matched by an automaton, in linear time."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest

from cellsight.api.headers import PATH, SKIPPED_CELLS
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support.api_world import ADMIN, build_world, load_index, make_client

NEWEST = {**ADMIN, "OpenStack-API-Version": "compute 2.96"}
LENGTH = 6000


@pytest.mark.parametrize("pattern", ["a*a*b", "[^b]*[^b]*b", "^a*a*b$"])
def test_a_regex_over_long_descriptions_answers_alike_on_both_paths(
    tmp_path: Path, pattern: str
) -> None:
    world = build_world(tmp_path / "w", "sqlite")
    live = [row for _, row in world.rows() if not row["deleted"] and not row["forthcoming"]]
    # Long enough for ``re`` to run past the 10 s deadline (about a minute), short
    # enough that a regression fails the test instead of hanging it for hours.
    long_values = {live[0]["uuid"]: "a" * LENGTH, live[1]["uuid"]: "a" * (LENGTH - 1) + "b"}
    for row in live[:2]:
        world.set_row(row["uuid"], display_description=long_values[row["uuid"]])
        world.set_row(row["uuid"], revision=row["revision"] + 1)
    described = {r["uuid"]: long_values.get(r["uuid"], r["display_description"]) for r in live}
    # The oracle: the first two patterns match the values holding a "b"; the anchored
    # one those that are a's then one "b".
    if pattern.startswith("^"):
        want = {u for u, d in described.items() if d and re.fullmatch("a*b", d)}
    else:
        want = {u for u, d in described.items() if d and "b" in d}
    assert live[1]["uuid"] in want and live[0]["uuid"] not in want

    engine = EmbeddedEngine(tmp_path / "index.db", prefix="long")
    load_index(engine, world)
    url = f"/v2.1/servers?all_tenants=1&limit=1000&display_description={quote(pattern, safe='')}"
    bodies = {}
    for name, client in (
        ("index", make_client(tmp_path / "i", world, engine)),
        ("fanout", make_client(tmp_path / "f", world)),
    ):
        with client:
            response = client.get(url, headers=NEWEST)
            again = client.get("/v2.1/servers?all_tenants=1&limit=1", headers=NEWEST)
        assert response.status_code == 200, response.text
        assert SKIPPED_CELLS not in response.headers, response.headers[SKIPPED_CELLS]
        assert response.headers[PATH] == name
        assert again.headers[PATH] == name  # the index was not taken for down
        assert {s["id"] for s in response.json()["servers"]} == want
        bodies[name] = response.content
    assert bodies["index"] == bodies["fanout"]
    world.close()
