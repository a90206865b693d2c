"""Index searches run ``index_searches`` at once; a request that finds no room within
``fanout_admission_wait`` gets a 503 with ``Retry-After``, is not answered from the
cells, and counts nothing against the engine.

Found by a resource-exhaustion probe: a hundred clients starved the API process of CPU,
searches ran past ``search_timeout`` for that alone, and each was then answered from the
cells as well, adding work where there was too much and reporting healthy cells as
timed out.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cellsight.api.headers import PATH
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support.api_world import ADMIN, World, load_index, make_client, project_tokens

LISTING = "/v2.1/servers?all_tenants=1&limit=5"


def test_a_search_past_the_admitted_ones_is_a_503_and_leaves_the_index_serving(
    sqlite_world: World, tmp_path: Path
) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="adm")
    load_index(engine, sqlite_world)
    entered, release = threading.Event(), threading.Event()
    search = engine.search

    def held(*args: Any, **kwargs: Any) -> Any:
        if not release.is_set():
            entered.set()
            assert release.wait(30)
        return search(*args, **kwargs)

    engine.search = held  # type: ignore[method-assign]
    client = make_client(
        tmp_path, sqlite_world, engine, index_searches=1, fanout_admission_wait=0.2
    )
    with client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.get, LISTING, headers=ADMIN)
        assert entered.wait(30)  # the one admitted search, held in the engine
        refused = client.get(LISTING, headers=ADMIN)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert "busy answering other searches" in refused.json()["serviceUnavailable"]["message"]
        assert client.get("/healthz").json()["safe_connect"] == {"flag": False}
        release.set()
        answered = first.result(30)
        assert answered.status_code == 200 and answered.headers[PATH] == "index"
        again = client.get(LISTING, headers=ADMIN)
        assert again.status_code == 200 and again.headers[PATH] == "index"
        assert again.json() == answered.json()
        metrics = client.get("/metrics").text
        assert 'cellsight_api_index_admission_total{result="refused"} 1.0' in metrics
    engine.close()


def test_one_project_holds_at_most_half_the_slots(sqlite_world: World, tmp_path: Path) -> None:
    """A review: a member keeping its costly searches running took every slot, and every
    other caller got a 503."""
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="adm2")
    load_index(engine, sqlite_world)
    entered, release = threading.Event(), threading.Event()
    search = engine.search
    first_call = threading.Lock()

    def held(*args: Any, **kwargs: Any) -> Any:
        if first_call.acquire(blocking=False):  # only the first search is held
            entered.set()
            assert release.wait(30)
        return search(*args, **kwargs)

    engine.search = held  # type: ignore[method-assign]
    member, other = project_tokens(sqlite_world)[:2]
    client = make_client(
        tmp_path, sqlite_world, engine, index_searches=2, fanout_admission_wait=0.2
    )
    with client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.get, "/v2.1/servers", headers=member)
        assert entered.wait(30)  # the member's one slot of two, held
        refused = client.get("/v2.1/servers", headers=member)
        assert refused.status_code == 503, refused.text
        assert "this project's searches" in refused.text
        for token in (other, ADMIN):  # answered meanwhile, by the other slot
            answered = client.get("/v2.1/servers", headers=token)
            assert answered.status_code == 200 and answered.headers[PATH] == "index"
        release.set()
        assert first.result(30).status_code == 200
    engine.close()
