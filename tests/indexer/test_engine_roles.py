"""Engine roles beyond the shared contract: declared capabilities, bulk requests in
flight (bounded, answered in order), the one scan per engine (a point in time where the
cluster has one), and errors classified by status code or state, never by text.

The in-flight tests need requests that finish when the test says so: a small local
``_bulk`` endpoint that holds each request until its batch is released (no real cluster
can be paused per request). Everything else runs on osmem and the embedded engine.
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.base import (
    EngineConflict,
    EngineRejected,
    EngineUnavailable,
    IndexMissing,
    ScanContextLost,
    SearchEngine,
    WriteOp,
    WriteStatus,
)
from cellsight.indexer.engines.bulk_queue import InFlight
from cellsight.indexer.engines.elasticsearch import ElasticsearchEngine
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.http_errors import from_status
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from tests.support.es_compat import ES_CLIENT_OPTIONS

WAIT = 10.0  # bound on waiting for an event that must happen


def op(doc_id: str, version: int) -> WriteOp:
    return WriteOp("instance", doc_id, version, {"uuid": doc_id, "version": version})


class GatedBulk:
    """A ``_bulk`` endpoint holding each request until its batch (the number before the
    ``-`` in its first id) is released; answers 503 for batches in ``fail``."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.fail: set[int] = set()
        self.active = 0
        self.most = 0
        self.changed = threading.Condition()
        gated = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path.startswith("/_alias/"):
                    self._reply(200, {"idx": {"aliases": {self.path[8:]: {}}}})
                else:
                    self._reply(200, {"version": {"distribution": "opensearch"}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
                headers = lines[::2]
                batch = int(headers[0]["index"]["_id"].split("-")[0])
                gated.enter()
                try:
                    gated.gate(batch).wait(WAIT)
                    if batch in gated.fail:
                        self._reply(503, {"error": {"type": "unavailable", "reason": "x"}})
                        return
                    items = [{"index": {"_id": h["index"]["_id"], "status": 201}} for h in headers]
                    self._reply(200, {"errors": False, "took": 1, "items": items})
                finally:
                    gated.leave()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def gate(self, batch: int) -> threading.Event:
        with self.changed:
            return self.gates.setdefault(batch, threading.Event())

    def enter(self) -> None:
        with self.changed:
            self.active += 1
            self.most = max(self.most, self.active)
            self.changed.notify_all()

    def leave(self) -> None:
        with self.changed:
            self.active -= 1
            self.changed.notify_all()

    def wait_active(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.active == n, WAIT), self.active

    def close(self) -> None:
        for event in list(self.gates.values()):
            event.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gated() -> Iterator[GatedBulk]:
    server = GatedBulk()
    yield server
    server.close()


def batch(n: int, size: int = 3) -> list[WriteOp]:
    return [op(f"{n}-{i}", n + 1) for i in range(size)]


def test_results_come_back_in_submission_order(gated: GatedBulk) -> None:
    engine = OpenSearchEngine(gated.url, prefix="t", max_in_flight=3)
    inflight: InFlight[int] = InFlight(engine)
    for n in range(3):
        inflight.submit(batch(n), n)
    gated.wait_active(3)  # all three in flight at once
    gated.gate(2).set()
    gated.gate(1).set()
    gated.wait_active(1)
    assert list(inflight.ready()) == []  # the oldest still runs: nothing to ack yet
    gated.gate(0).set()
    done = list(inflight.drain(WAIT))
    assert [tag for tag, _ in done] == [0, 1, 2]
    assert all(r.status is WriteStatus.OK for _, results in done for r in results)
    engine.close()


def test_in_flight_requests_are_bounded(gated: GatedBulk) -> None:
    engine = OpenSearchEngine(gated.url, prefix="t", max_in_flight=2)
    assert engine.capabilities.max_in_flight == 2
    inflight: InFlight[int] = InFlight(engine)
    inflight.submit(batch(0), 0)
    inflight.submit(batch(1), 1)
    gated.wait_active(2)
    third = threading.Event()

    def submit_third() -> None:
        inflight.submit(batch(2), 2)
        third.set()

    threading.Thread(target=submit_third, daemon=True).start()
    assert not third.wait(0.3)  # the third waits for a free slot
    gated.gate(0).set()
    assert third.wait(WAIT)
    gated.gate(1).set()
    gated.gate(2).set()
    assert [tag for tag, _ in inflight.drain(WAIT)] == [0, 1, 2]
    assert gated.most == 2
    engine.close()


def test_a_failed_request_stops_acks_at_its_place(gated: GatedBulk) -> None:
    engine = OpenSearchEngine(gated.url, prefix="t", max_in_flight=5)
    gated.fail.add(1)
    inflight: InFlight[int] = InFlight(engine)
    for n in range(3):
        gated.gate(n).set()
        inflight.submit(batch(n), n)
    drained = inflight.drain(WAIT)
    assert next(drained)[0] == 0
    with pytest.raises(EngineUnavailable):
        next(drained)
    tag, ops, exc = inflight.pop_failed()
    assert (tag, ops, type(exc)) == (1, batch(1), EngineUnavailable)
    assert [t for t, _ in inflight.drain(WAIT)] == [2]
    engine.close()


def test_the_embedded_engine_writes_one_batch_at_a_time(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "i.db", prefix="t")
    engine.ensure_ready("instance")
    assert engine.capabilities.max_in_flight == 1
    inflight: InFlight[str] = InFlight(engine)
    inflight.submit([op("a", 2)], "first")
    inflight.submit([op("a", 1), op("b", 1)], "second")
    out = dict(inflight.ready())  # written at submit: both are finished
    assert [r.status for r in out["first"]] == [WriteStatus.OK]
    assert [r.status for r in out["second"]] == [WriteStatus.STALE, WriteStatus.OK]
    engine.close()


def test_embedded_reopens_in_another_process_from_a_pickle(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "i.db", prefix="t", synchronous="FULL", cache_mb=8)
    engine.ensure_ready("instance")
    engine.bulk([op("a", 7)])
    assert engine.capabilities.worker_processes
    factory: Callable[[], SearchEngine] = pickle.loads(pickle.dumps(engine.reopener()))
    other = factory()
    assert isinstance(other, EmbeddedEngine)
    assert (other.path, other.prefix, other.synchronous, other.cache_mb) == (
        engine.path,
        "t",
        "FULL",
        8,
    )
    assert list(other.iter_versions("instance")) == [("a", 7)]
    other.close()
    engine.close()


def test_http_engines_build_no_sync_in_processes_but_reopen_for_a_writer(osmem_url: str) -> None:
    engine = OpenSearchEngine(osmem_url, prefix="t", timeout=7.0)
    assert not engine.capabilities.worker_processes  # a sync builds over HTTP, in-process
    engine.ensure_ready("instance")
    engine.bulk([WriteOp("instance", "a", 3, {"uuid": "a", "version": 3})])
    # The indexer's writer process opens its own client of the same cluster.
    other = pickle.loads(pickle.dumps(engine.reopener()))()
    assert type(other) is OpenSearchEngine and other.client is not engine.client
    assert (other.prefix, other.timeout) == ("t", 7.0)
    stored = other.get("instance", "a")
    assert stored is not None and stored.version == 3
    other.close()
    engine.close()


class PitCounting(OpenSearchEngine):
    opened: list[str]
    closed: list[str]

    def _open_pit(self, target: str) -> str:
        pit = super()._open_pit(target)
        self.opened.append(target)
        return pit

    def _close_pit(self, pit: str) -> None:
        super()._close_pit(pit)
        self.closed.append(pit)


def test_opensearch_scans_over_one_point_in_time(osmem_url: str) -> None:
    engine = PitCounting(osmem_url, prefix="t")
    engine.opened, engine.closed = [], []
    engine.ensure_ready("instance")
    ids = [f"id-{i:02d}" for i in range(7)]
    engine.bulk([op(i, 3) for i in reversed(ids)])
    engine.refresh("instance")
    assert list(engine.iter_versions("instance", batch_size=2)) == [(i, 3) for i in ids]
    assert engine.opened == ["t-instance"] and len(engine.closed) == 1
    engine.close()


def test_a_scan_whose_point_in_time_expired_goes_on_over_a_new_one(osmem_url: str) -> None:
    """Left from a review: a page after a gap past the keep-alive (repairs between pages
    retried through an outage) got a 404, not retried, and the cell went uncompared."""
    engine = PitCounting(osmem_url, prefix="t")
    engine.opened, engine.closed = [], []
    engine.ensure_ready("instance")
    ids = [f"id-{i:02d}" for i in range(7)]
    engine.bulk([op(i, 3) for i in ids])
    engine.refresh("instance")
    given: list[str] = []
    opening = engine._open_pit

    def remembered(target: str) -> str:
        given.append(opening(target))
        return given[-1]

    engine._open_pit = remembered  # type: ignore[method-assign]
    scan = engine.iter_versions("instance", batch_size=2)
    first = [next(scan), next(scan)]
    engine._close_pit(given[0])  # expired, as the next page meets it
    rest = list(scan)
    assert first + rest == [(i, 3) for i in ids]
    assert engine.opened == ["t-instance", "t-instance"] and len(given) == 2
    assert engine.closed == [given[0], given[1]]  # the new one closed at the end
    engine.close()


def test_a_cluster_without_point_in_time_is_scanned_without(osmem_url: str) -> None:
    # osmem has OpenSearch's point-in-time API, not Elasticsearch's ``_pit``
    engine = ElasticsearchEngine(osmem_url, prefix="t", **ES_CLIENT_OPTIONS)
    assert engine.capabilities.point_in_time
    engine.ensure_ready("instance")
    engine.bulk([op("b", 2), op("a", 1)])
    engine.refresh("instance")
    assert list(engine.iter_versions("instance", batch_size=1)) == [("a", 1), ("b", 2)]
    assert not engine.capabilities.point_in_time  # asked once, then no more
    engine.close()


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, IndexMissing),
        (409, EngineConflict),
        (408, EngineUnavailable),
        (429, EngineUnavailable),
        (503, EngineUnavailable),
        (400, EngineRejected),
        (401, EngineRejected),
        (403, EngineRejected),
    ],
)
def test_answers_are_classified_by_status(status: int, error: type[Exception]) -> None:
    body = {"error": {"type": "some_exception", "reason": "any text at all"}, "status": status}
    exc = from_status(status, body, "GET /x")
    assert type(exc) is error
    assert (exc.status, exc.body) == (status, body)
    assert "GET /x" in str(exc) and "some_exception" in str(exc)


def test_a_point_in_time_gone_is_told_from_a_missing_index() -> None:
    cause = {"type": "search_context_missing_exception", "reason": "No search context"}
    body = {"error": {"type": "search_phase_execution_exception", "root_cause": [cause]}}
    assert type(from_status(404, body, "POST /_search")) is ScanContextLost
    assert type(from_status(404, {"error": cause}, "POST /_search")) is ScanContextLost


def test_a_scan_of_an_index_dropped_under_it_is_index_missing(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "i.db", prefix="t")
    engine.create_index("instance", "t-instance-new", bulk_load=True)
    list(engine.bulk_index("t-instance-new", iter([op("a", 1), op("b", 1), op("c", 1)])))
    scan = engine.iter_versions("instance", batch_size=2, index="t-instance-new")
    assert next(scan) == ("a", 1)
    assert next(scan) == ("b", 1)
    other = EmbeddedEngine(tmp_path / "i.db", prefix="t")
    other.drop_index("t-instance-new")
    with pytest.raises(IndexMissing):
        next(scan)
    other.close()
    engine.close()


def test_count_and_versions_of_a_concrete_index(engine: SearchEngine) -> None:
    engine.ensure_ready("instance")
    engine.create_index("instance", f"{engine.prefix}-instance-next", bulk_load=True)
    name = f"{engine.prefix}-instance-next"
    docs = [
        WriteOp("instance", i, 5, {"uuid": i, "version": 5, "cell_uuid": c})
        for i, c in (("x", "c1"), ("y", "c2"), ("z", "c1"))
    ]
    assert all(r.status is WriteStatus.OK for r in engine.bulk_index(name, iter(docs)))
    assert engine.count("instance") == 0  # the read alias still serves the old index
    assert engine.count("instance", index=name) == 3
    assert engine.count("instance", "c1", index=name) == 2
    assert list(engine.iter_versions("instance", "c1", 1, index=name)) == [("x", 5), ("z", 5)]
    with pytest.raises(IndexMissing):
        engine.count("instance", index=f"{engine.prefix}-instance-nosuch")
