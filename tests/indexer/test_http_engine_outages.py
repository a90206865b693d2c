"""The HTTP engines when the cluster stops answering or answers with overload errors:
a paused or stopped osmem (an in-memory OpenSearch-compatible server) of the test's own,
and canned 429/503 answers from a small local HTTP server, through both clients.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from osmem_server import OsmemServer

from cellsight.indexer.engines.base import EngineUnavailable, WriteStatus
from tests.support.http_engines import Handler, Reply, make_engine, op

pytestmark = pytest.mark.services


def pause(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (the signal lands asynchronously)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state == "T":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def test_a_paused_cluster_is_unavailable_within_the_timeout(
    kind: str, own_osmem: OsmemServer
) -> None:
    eng = make_engine(kind, own_osmem.url, timeout=0.5, bulk_timeout=0.5)
    eng.ensure_ready("instance")
    pause(own_osmem.pid)
    try:
        for call in (eng.ping, lambda: eng.get("instance", "a"), lambda: eng.bulk([op("a", 1)])):
            started = time.monotonic()
            with pytest.raises(EngineUnavailable):
                call()
            assert time.monotonic() - started < 3
    finally:
        os.kill(own_osmem.pid, signal.SIGCONT)
    eng.ping()  # and it comes back without a new engine
    assert eng.bulk([op("a", 1)])[0].status is WriteStatus.OK
    eng.close()


def test_a_stopped_cluster_is_unavailable(kind: str, own_osmem: OsmemServer) -> None:
    eng = make_engine(kind, own_osmem.url, timeout=1)
    eng.ensure_ready("instance")
    own_osmem.close()
    for call in (
        eng.ping,
        lambda: eng.bulk([op("a", 1)]),
        lambda: eng.get_many("instance", ["a"]),
        lambda: list(eng.bulk_index("x", iter([op("a", 1)]))),
    ):
        with pytest.raises(EngineUnavailable):
            call()
    eng.close()


def overloaded(status: int) -> Handler:
    def handler(method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Reply:
        error = {"type": "es_rejected_execution_exception", "reason": "queue full"}
        return status, {}, {"error": error, "status": status}

    return handler


@pytest.mark.parametrize("status", [429, 503])
def test_overload_answers_are_unavailable(
    kind: str, status: int, canned: Callable[[Handler], str]
) -> None:
    eng = make_engine(kind, canned(overloaded(status)))
    for call in (lambda: eng.get("instance", "a"), lambda: eng.bulk([op("a", 1)]), eng.ping):
        with pytest.raises(EngineUnavailable, match=str(status)):
            call()
    eng.close()


def test_item_overload_is_retry_and_whole_bulk_overload_is_unavailable(
    kind: str, canned: Callable[[Handler], str]
) -> None:
    bulk_status = [200]

    def handler(method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Reply:
        if path.startswith("/_alias/"):
            return 200, {}, {"t-instance-1": {"aliases": {"t-instance-write": {}}}}
        if path.startswith("/_bulk"):
            if bulk_status[0] != 200:
                return bulk_status[0], {}, {"error": {"type": "x", "reason": "busy"}}
            lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
            ids = [h["index"]["_id"] for h in lines[::2]]
            items = [
                {
                    "index": {
                        "_id": ids[0],
                        "status": 429,
                        "error": {"type": "es_rejected_execution_exception", "reason": "full"},
                    }
                },
                {
                    "index": {
                        "_id": ids[1],
                        "status": 503,
                        "error": {"type": "unavailable_shards_exception", "reason": "gone"},
                    }
                },
                {"index": {"_id": ids[2], "status": 201, "result": "created"}},
            ]
            return 200, {}, {"took": 1, "errors": True, "items": items}
        return 404, {}, {"error": "no handler", "status": 404}

    eng = make_engine(kind, canned(handler))
    results = eng.bulk([op("a", 1), op("b", 1), op("c", 1)])
    assert [r.status for r in results] == [WriteStatus.RETRY, WriteStatus.RETRY, WriteStatus.OK]
    bulk_status[0] = 502
    with pytest.raises(EngineUnavailable):
        eng.bulk([op("a", 1)])
    eng.close()


@pytest.mark.parametrize(
    "answer",
    [b"", b'{"errors":true,"items":[' + b"x" * 50_000, b"<html>ok</html>", b'"a string"'],
    ids=["empty", "cut-short", "html", "a-string"],
)
def test_a_2xx_answer_that_is_no_json_object_is_unavailable(
    kind: str, answer: bytes, canned: Callable[[Handler], str]
) -> None:
    """An engine probe: a proxy answering 200 with an empty, HTML or cut-short body
    stopped the indexer (the bulk helper's ``TypeError``, or the client's
    ``SerializationError`` with the whole body in its message) and made the API answer
    500 (the purge floor's record read). It is the engine being unavailable: retried."""

    def handler(method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Reply:
        if path.startswith("/_alias/"):
            return 200, {}, {"t-instance-1": {"aliases": {"t-instance-write": {}}}}
        return 200, {}, answer

    eng = make_engine(kind, canned(handler))
    for call in (
        lambda: eng.get("instance", "a"),
        lambda: eng.bulk([op("a", 1)]),
        lambda: eng.get_meta("purge_floor:instance"),
        eng.ping,
    ):
        with pytest.raises(EngineUnavailable) as caught:
            call()
        assert "not JSON" in str(caught.value) and len(str(caught.value)) < 500
    eng.close()
