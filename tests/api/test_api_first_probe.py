"""A fresh API over a configured engine that answers: its first requests are served by
the index. A parity probe saw them answered from the cells, and the safe-connect flag
set (with its warning) on an index that answered a moment later: requests came in
before the background prober had connected the engine."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.clients import build_engine
from tests.support.api_world import World, api_settings, load_index
from tests.support.bulk_faults import BulkFaults

ADMIN = {"X-Auth-Token": "root:admin"}


@pytest.mark.parametrize("engine_kind", ["embedded", "osmem"])
def test_the_first_requests_of_a_fresh_api_are_served_by_the_index(
    engine_kind: str, sqlite_world: World, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    link = None
    search: dict[str, str] = {}
    if engine_kind == "osmem":
        # The engine's first answer (what it is, asked as it is connected) comes late.
        link = BulkFaults(request.getfixturevalue("osmem_url"), endpoint="/")
        search = {"search_url": link.url, "index_prefix": f"f{uuid.uuid4().hex[:8]}"}
    settings = api_settings(
        tmp_path, api_db_url=str(sqlite_world.registry.api_engine.url), **search
    )
    engine = build_engine(settings)
    load_index(engine, sqlite_world)
    engine.close()
    try:
        for _ in range(3):  # each a fresh API: its prober connects its own engine
            if link is not None:
                link.arm(0.5, first=1)
            app = create_app(settings, registry=sqlite_world.registry)
            with TestClient(app) as client:
                listing = client.get("/v2.1/servers?all_tenants=1&limit=5", headers=ADMIN)
                assert listing.status_code == 200, listing.text
                assert listing.headers["X-Cellsight-Path"] == "index"
                assert client.get("/readyz").json()["safe_connect"]["flag"] is False
    finally:
        if link is not None:
            link.close()
