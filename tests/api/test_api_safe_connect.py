"""Safe-connect: the engine goes away, listings keep answering from the cells, the
index is not asked again until the cool-down passes, then serves again.

The engine is a real OpenSearch-compatible server (osmem) behind a TCP proxy the test
can stop (connections refused) and start again on the same port. "Pays nothing for the
index" is measured as the count of HTTP requests the engine client sends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.cell_query import row_document
from cellsight.api.headers import PATH
from cellsight.api.safe_connect import SafeConnect
from cellsight.indexer.engines.base import EngineUnavailable, WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from tests.support.api_world import ADMIN, World, api_settings, load_index, make_client
from tests.support.clock import ManualClock
from tests.support.proxy import Proxy
from tests.support.waiting import wait_for


@pytest.fixture
def proxied(osmem_url: str) -> Iterator[tuple[Proxy, str]]:
    host, port = osmem_url.split("//", 1)[1].rstrip("/").split(":")
    proxy = Proxy((host, int(port)))
    proxy.start()
    yield proxy, f"http://127.0.0.1:{proxy.port}"
    proxy.stop()


class Counting(OpenSearchEngine):
    """Counts every request the engine client sends."""

    calls = 0

    def _send(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super()._send(*args, **kwargs)


def test_engine_down_then_back(
    proxied: tuple[Proxy, str], sqlite_world: World, tmp_path: Path
) -> None:
    proxy, url = proxied

    class Engine(Counting):
        calls = 0

    engine = Engine(url, prefix=f"s{uuid.uuid4().hex[:8]}", timeout=2.0)
    load_index(engine, sqlite_world)
    client = make_client(tmp_path, sqlite_world, engine, safe_connect_cooldown=1.0)
    clock = ManualClock()
    client.app.state.safe_connect.clock = clock  # type: ignore[attr-defined]
    listing = "/v2.1/servers/detail?all_tenants=1&limit=20"
    first = client.get(listing, headers=ADMIN)
    assert first.status_code == 200 and first.headers[PATH] == "index"
    expected = first.json()

    proxy.stop()
    before = Engine.calls
    started = time.monotonic()
    failed_over = client.get(listing, headers=ADMIN)
    assert failed_over.status_code == 200 and failed_over.headers[PATH] == "fanout"
    assert failed_over.json() == expected
    assert Engine.calls - before == 1, "the first request tries the index once"
    assert time.monotonic() - started < 2.0 + 1.0  # at most one connect timeout
    health = client.get("/healthz").json()
    assert health["path"] == "fanout" and health["safe_connect"]["flag"] is True

    before = Engine.calls
    for _ in range(5):
        again = client.get(listing, headers=ADMIN)
        assert again.status_code == 200 and again.headers[PATH] == "fanout"
    assert Engine.calls == before, "while the flag is set the index is not asked"

    proxy.start()
    clock.advance(0.5)  # the engine is back, but the cool-down has not passed
    before = Engine.calls
    assert client.get(listing, headers=ADMIN).headers[PATH] == "fanout"
    assert Engine.calls == before, "the index is not asked before the cool-down"
    clock.advance(0.5)
    back = client.get(listing, headers=ADMIN)
    assert back.status_code == 200 and back.headers[PATH] == "index"
    assert back.json() == expected
    assert client.get("/healthz").json()["safe_connect"] == {"flag": False}
    client.close()
    engine.close()


def test_cooldown_zero_keeps_the_cells_until_restart(
    proxied: tuple[Proxy, str], sqlite_world: World, tmp_path: Path
) -> None:
    proxy, url = proxied

    class Engine(Counting):
        calls = 0

    engine = Engine(url, prefix=f"z{uuid.uuid4().hex[:8]}", timeout=2.0)
    load_index(engine, sqlite_world)
    client = make_client(tmp_path, sqlite_world, engine, safe_connect_cooldown=0)
    clock = ManualClock()
    client.app.state.safe_connect.clock = clock  # type: ignore[attr-defined]
    assert client.get("/v2.1/servers?all_tenants=1", headers=ADMIN).headers[PATH] == "index"
    proxy.stop()
    assert client.get("/v2.1/servers?all_tenants=1", headers=ADMIN).headers[PATH] == "fanout"
    proxy.start()
    clock.advance(24 * 3600.0)  # no cool-down ever ends: only a restart clears the flag
    before = Engine.calls
    assert client.get("/v2.1/servers?all_tenants=1", headers=ADMIN).headers[PATH] == "fanout"
    assert Engine.calls == before
    assert client.get("/healthz").json()["safe_connect"]["next_probe_in"] is None
    client.close()
    engine.close()


def test_an_unsynced_index_is_not_used(sqlite_world: World, tmp_path: Path) -> None:
    client = make_client(tmp_path, sqlite_world)
    response = client.get("/v2.1/servers?all_tenants=1", headers=ADMIN)
    assert response.headers[PATH] == "fanout"
    health = client.get("/healthz").json()
    assert health["path"] == "fanout" and "synced" in health["reason"]
    client.close()


def test_an_index_file_made_again_is_not_trusted_at_the_next_request(
    sqlite_world: World, tmp_path: Path
) -> None:
    """``rm index.db*`` under a running API: the indexer makes its index again in a new
    file, which holds only what came after. The API reads the synced marker again at the
    next request (it used to answer from the new index until its next probe)."""
    path, prefix = tmp_path / "index.db", f"f{uuid.uuid4().hex[:8]}"
    engine = EmbeddedEngine(path, prefix=prefix)
    load_index(engine, sqlite_world)
    client = make_client(tmp_path / "api", sqlite_world, engine, index_probe_interval=3600)
    before = client.get("/v2.1/servers?all_tenants=1", headers=ADMIN)
    assert before.headers[PATH] == "index"
    listed = {s["id"] for s in before.json()["servers"]}
    for name in ("index.db", "index.db-wal", "index.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    indexer = EmbeddedEngine(path, prefix=prefix)  # as the writer, in its own process
    indexer.ensure_ready("instance")
    cell_uuid, row = next(iter(sqlite_world.rows()))
    stored = row_document(row, cell_uuid)
    indexer.bulk([WriteOp("instance", stored.id, stored.version, stored.document)])
    indexer.close()
    after = client.get("/v2.1/servers?all_tenants=1", headers=ADMIN)
    assert after.headers[PATH] == "fanout"
    assert {s["id"] for s in after.json()["servers"]} == listed
    assert "synced" in client.get("/healthz").json()["reason"]
    client.close()
    engine.close()


def test_backoff_and_a_single_probe() -> None:
    clock = ManualClock(0.0)
    flag = SafeConnect(10.0, max_cooldown=40.0, clock=clock)
    assert flag.use_index()
    flag.failed(ConnectionError("refused"))
    assert not flag.use_index()
    clock.now = 10.0
    assert flag.use_index()  # the probe
    assert not flag.use_index()  # only one at a time
    flag.failed(ConnectionError("refused"))
    clock.now = 29.0
    assert not flag.use_index()  # 20 s after the second failure
    clock.now = 30.0
    assert flag.use_index()
    flag.failed(ConnectionError("refused"))
    clock.now = 69.0
    assert not flag.use_index()
    clock.now = 70.0  # capped at 40 s
    assert flag.use_index()
    flag.succeeded()
    assert flag.use_index() and flag.status() == {"flag": False}


@pytest.mark.parametrize("cooldown", [0.0, 30.0])
def test_the_background_probe_keeps_to_the_cool_down(
    sqlite_world: World, tmp_path: Path, cooldown: float
) -> None:
    """The prober worked out its next wait before it slept, on the schedule of a flag not
    set: a request's failure meanwhile was cleared by its next probe 2.5-3.5 s later,
    whatever the cool-down (0 included, "until restart": a probe saw it four times)."""
    engine = EmbeddedEngine(tmp_path / "index.db", prefix=f"p{uuid.uuid4().hex[:8]}")
    load_index(engine, sqlite_world)
    settings = {"safe_connect_cooldown": cooldown, "index_probe_interval": 3600}
    with make_client(tmp_path / "api", sqlite_world, engine, **settings) as client:
        state = client.app.state  # type: ignore[attr-defined]
        prober, flag = state.prober, state.safe_connect
        # Its first probe, at start, on its own thread: it would clear the flag set below.
        wait_for(lambda: prober.last_probe_at is not None, 10, "the prober's first probe")
        assert client.get("/v2.1/servers", headers=ADMIN).headers[PATH] == "index"
        clock = ManualClock()
        flag.clock = clock
        flag.failed(EngineUnavailable("a request's search ran past its deadline"))
        probed = prober.last_probe_at
        assert prober.tick() == (3600.0 if cooldown == 0 else cooldown)
        assert prober.last_probe_at == probed and flag.flagged
        assert client.get("/v2.1/servers", headers=ADMIN).headers[PATH] == "fanout"
        clock.advance(cooldown or 10**6)
        if cooldown == 0:
            assert prober.tick() == 3600.0 and flag.flagged  # until restart
            assert prober.last_probe_at == probed
        else:
            assert prober.tick() == 3600.0  # probed: the index answers, the flag is down
            assert prober.last_probe_at != probed and not flag.flagged
            assert client.get("/v2.1/servers", headers=ADMIN).headers[PATH] == "index"
    engine.close()


def test_with_no_cool_down_an_api_started_before_its_engine_still_connects(
    sqlite_world: World, tmp_path: Path
) -> None:
    """ "Until restart" is for an index that served and failed: an API started while its
    engine was still coming up (compose) probed once and never again (a review)."""
    app = create_app(
        api_settings(
            tmp_path,
            search_url="http://127.0.0.1:1",
            safe_connect_cooldown=0,
            index_probe_interval=3600,
        ),
        registry=sqlite_world.registry,
    )
    with TestClient(app) as client:
        prober, flag = app.state.prober, app.state.safe_connect
        wait_for(lambda: prober.last_probe_at is not None, 10, "the prober's first probe")
        assert flag.flagged
        first = prober.last_probe_at
        assert prober.tick() == 3600  # probed again, on the probe interval
        assert prober.last_probe_at != first and prober.last_result.startswith("unavailable")
        assert client.get("/v2.1/servers", headers=ADMIN).headers[PATH] == "fanout"
