"""A search that runs past ``search_timeout`` while the engine still answers is a heavy
query, not an outage: that request is answered by fan-out (the same body) and the
safe-connect flag stays down, so the next listing is the index's again. Only when an
ordinary search (the yardstick) is slow too does it count, and ``SLOW_TRIPS`` such
searches in a row set the flag.

Found from outside: one member's costly filter (a regex the subset allows) ran past
the deadline and sent every client's listings to the cells for the cool-down.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cellsight.api.headers import PATH
from cellsight.api.safe_connect import SLOW_TRIPS, SafeConnect
from cellsight.api.yardstick import Yardstick
from cellsight.indexer.engines.base import EngineTimeout
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from tests.support.api_world import ADMIN, World, load_index, make_client
from tests.support.bulk_faults import TIMEOUT, BulkFaults
from tests.support.clock import ManualClock

LISTING = "/v2.1/servers/detail?all_tenants=1&limit=20"


def test_slow_searches_set_the_flag_only_in_a_row() -> None:
    flag = SafeConnect(10.0, clock=ManualClock(0.0))
    slow = EngineTimeout("ran past 1 s")
    for _ in range(SLOW_TRIPS - 1):
        assert flag.slow(slow) is False and not flag.flagged
    flag.succeeded()  # a search answered: the count starts again
    for _ in range(SLOW_TRIPS - 1):
        assert flag.slow(slow) is False
    assert flag.slow(slow) is True and flag.flagged
    assert "ran past 1 s" in flag.status()["reason"]


def test_the_background_probe_leaves_the_count_of_slow_searches() -> None:
    """An engine probe: the probe (which reads records, not a search) reset the count,
    so a client listing one page at a time waited out every search, for ever."""
    flag = SafeConnect(10.0, clock=ManualClock(0.0))
    slow = EngineTimeout("ran past 1 s")
    for _ in range(SLOW_TRIPS - 1):
        flag.slow(slow)
    flag.succeeded(searched=False)  # a probe between two searches
    assert flag.slow(slow) is True and flag.flagged
    flag.succeeded(searched=False)  # the probe after the cool-down clears the flag ...
    assert not flag.flagged
    assert flag.slow(slow) is True  # ... and the next slow search sets it again
    assert flag.next_probe_in() == 20.0  # with a doubled wait
    flag.succeeded()  # a search answered: all is forgotten
    assert not flag.flagged and flag.slow(slow) is False


def test_a_slow_probe_keeps_the_flag() -> None:
    clock = ManualClock(0.0)
    flag = SafeConnect(10.0, clock=clock)
    flag.failed(ConnectionError("refused"))
    clock.now = 10.0
    assert flag.use_index()  # the probe, which is slow
    assert flag.slow(EngineTimeout("ran past 1 s")) is True
    assert not flag.use_index()  # the next probe waits out a doubled cool-down


@pytest.fixture
def faults(osmem_url: str) -> Iterator[BulkFaults]:
    proxy = BulkFaults(osmem_url, endpoint="/_search")
    yield proxy
    proxy.close()


def test_a_heavy_search_is_answered_by_the_cells_and_leaves_the_index_serving(
    faults: BulkFaults, sqlite_world: World, tmp_path: Path
) -> None:
    engine = OpenSearchEngine(faults.url, prefix=f"w{uuid.uuid4().hex[:8]}", timeout=1.0)
    load_index(engine, sqlite_world)
    with make_client(tmp_path, sqlite_world, engine, safe_connect_cooldown=600.0) as client:
        first = client.get(LISTING, headers=ADMIN)
        assert first.status_code == 200 and first.headers[PATH] == "index"

        faults.arm(TIMEOUT, first=1, times=1)  # this one search gets no answer in time
        heavy = client.get(LISTING, headers=ADMIN)
        assert heavy.status_code == 200 and heavy.headers[PATH] == "fanout"
        assert heavy.json() == first.json()
        assert client.get("/healthz").json()["safe_connect"] == {"flag": False}
        assert client.get(LISTING, headers=ADMIN).headers[PATH] == "index"

        # A resource-exhaustion probe: three costly requests in a row (a member's regexes)
        # set the flag for every client while ordinary searches answered at once.
        for _ in range(SLOW_TRIPS + 1):
            faults.arm(TIMEOUT, first=1, times=1)  # this request's search alone
            costly = client.get(LISTING, headers=ADMIN)
            assert costly.status_code == 200 and costly.headers[PATH] == "fanout"
        assert client.get("/healthz").json()["safe_connect"] == {"flag": False}
        assert client.get(LISTING, headers=ADMIN).headers[PATH] == "index"

        faults.arm(TIMEOUT, first=1, times=None)  # every search: slow for everyone
        paths = [client.get(LISTING, headers=ADMIN).headers[PATH] for _ in range(SLOW_TRIPS)]
        assert paths == ["fanout"] * SLOW_TRIPS
        health = client.get("/healthz").json()
        assert health["safe_connect"]["flag"] is True and health["path"] == "fanout"
        searched = len(faults.bodies)
        assert client.get(LISTING, headers=ADMIN).headers[PATH] == "fanout"
        assert len(faults.bodies) == searched  # while the flag is set, no search is sent
    engine.close()


def test_a_record_answered_with_no_json_is_served_by_the_cells(
    osmem_url: str, sqlite_world: World, tmp_path: Path
) -> None:
    """An engine probe: a 200 whose body did not parse, on the engine's records (the
    synced marker, the purge floor), made every listing a 500."""
    records = BulkFaults(osmem_url, endpoint="-meta/_doc/")
    engine = OpenSearchEngine(records.url, prefix=f"g{uuid.uuid4().hex[:8]}", timeout=2.0)
    try:
        load_index(engine, sqlite_world)
        records.arm(b'{"_id":', first=1, times=None)
        with make_client(tmp_path, sqlite_world, engine) as client:
            for path in (LISTING, "/v2.1/servers?all_tenants=1"):
                listing = client.get(path, headers=ADMIN)
                assert listing.status_code == 200 and listing.headers[PATH] == "fanout"
            assert records.spoiled  # the records were asked for, and spoiled
    finally:
        engine.close()
        records.close()


def test_a_probe_that_meets_a_costly_query_clears_the_flag(
    faults: BulkFaults, sqlite_world: World, tmp_path: Path
) -> None:
    """A review: a request probing the index (no background prober: the app run without
    its lifespan) whose search timed out while ordinary searches answered kept the probe
    role for good, and the flag was never cleared."""
    engine = OpenSearchEngine(faults.url, prefix=f"p{uuid.uuid4().hex[:8]}", timeout=1.0)
    load_index(engine, sqlite_world)
    client = make_client(tmp_path, sqlite_world, engine, safe_connect_cooldown=10.0)
    flag: SafeConnect = client.app.state.safe_connect  # type: ignore[attr-defined]
    clock = ManualClock(0.0)
    flag.clock = clock
    flag.failed(ConnectionError("refused"))
    assert client.get(LISTING, headers=ADMIN).headers[PATH] == "fanout"  # cooling down
    clock.now = 10.0
    faults.arm(TIMEOUT, first=1, times=1)  # the probe's own search alone is slow
    probe = client.get(LISTING, headers=ADMIN)
    assert probe.status_code == 200 and probe.headers[PATH] == "fanout"
    assert not flag.flagged  # the engine answered an ordinary search: it is well
    assert client.get(LISTING, headers=ADMIN).headers[PATH] == "index"
    engine.close()


def test_searches_timed_out_at_once_share_one_yardstick(faults: BulkFaults) -> None:
    """A review: every search that timed out ran its own yardstick, outside admission,
    so a burst of costly requests doubled the engine's load. One runs at a time, and
    the searches that timed out meanwhile take its answer."""
    engine = OpenSearchEngine(faults.url, prefix=f"y{uuid.uuid4().hex[:8]}", timeout=5.0)
    engine.ensure_ready("instance")
    yardstick = Yardstick(engine)
    faults.arm(0.3, first=1, times=None)  # every search answers, 0.3 s late
    start = threading.Barrier(8)

    def timed_out() -> bool | None:
        start.wait()
        return yardstick.answers()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: timed_out(), range(8)))
    assert answers == [True] * 8
    assert len(faults.bodies) == 1  # one yardstick reached the engine
    engine.close()
