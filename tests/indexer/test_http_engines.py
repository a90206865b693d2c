"""What the shared engine contract suite does not cover for the HTTP engines, on a
cluster that answers (its outages are in ``test_http_engine_outages.py``).

``build_engine``'s detection and errors, bulk item classification through both clients,
external versions above 2^53 and bulk-load settings. osmem (an in-memory
OpenSearch-compatible server) is the peer; the Elasticsearch client reaches it through
``tests.support.es_compat``. Canned answers come from a small local HTTP server.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines import UnsupportedEngineURL, build_engine, detect_distribution
from cellsight.indexer.engines.base import EngineError, EngineUnavailable, IndexMissing, WriteStatus
from cellsight.indexer.engines.http import HttpEngine, redact_url
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from tests.support.es_compat import plain_mimetype
from tests.support.http_engines import Handler, Reply, make_engine, op

pytestmark = pytest.mark.services

BIG = 1_400_000_000_000_000_001  # a time-derived version: far above 2^53


@pytest.fixture
def engine(kind: str, osmem_url: str) -> Iterator[HttpEngine]:
    eng = make_engine(kind, osmem_url)
    eng.ensure_ready("instance")
    yield eng
    eng.close()


def closed_port() -> int:
    """A local port with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def root_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Handler:
    return lambda method, path, request_headers, raw: (status, headers or {}, body)


ES9_ROOT = {
    "name": "node-1",
    "cluster_name": "prod",
    "version": {"number": "9.1.0", "build_flavor": "default", "lucene_version": "10.2.2"},
    "tagline": "You Know, for Search",
}
OS2_ROOT = {
    "name": "node-1",
    "version": {"distribution": "opensearch", "number": "2.19.0"},
    "tagline": "The OpenSearch Project: https://opensearch.org/",
}


# build_engine -------------------------------------------------------------------
def test_build_engine_detects_osmem_as_opensearch(osmem_url: str, tmp_path: Path) -> None:
    eng = build_engine(osmem_url, embedded_path=tmp_path / "index.db", prefix="p", timeout=2)
    try:
        assert isinstance(eng, OpenSearchEngine)
        assert eng.distribution == "opensearch" and eng.prefix == "p"
        eng.ping()
    finally:
        eng.close()


def test_build_engine_without_url_is_embedded(tmp_path: Path) -> None:
    from cellsight.indexer.engines.embedded import EmbeddedEngine

    eng = build_engine(None, embedded_path=tmp_path / "index.db", prefix="p")
    try:
        assert isinstance(eng, EmbeddedEngine) and eng.prefix == "p"
    finally:
        eng.close()


def test_build_engine_on_a_closed_port_is_unavailable_quickly(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match=f"{url}.*unreachable"):
        build_engine(url, embedded_path=tmp_path / "index.db", timeout=2)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest@localhost//",
        "elasticsearch://localhost:9200",
        "localhost:9200",
        "file:///tmp/index",
        "http://",
    ],
)
def test_other_schemes_are_refused_by_name(url: str, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedEngineURL, match="expected http://host:port"):
        build_engine(url, embedded_path=tmp_path / "index.db")


def test_elasticsearch_is_detected_by_its_answer(canned: Callable[[Handler], str]) -> None:
    with_header = canned(root_reply(200, ES9_ROOT, {"X-Elastic-Product": "Elasticsearch"}))
    assert detect_distribution(with_header) == "elasticsearch"
    # a proxy may drop the header: the body still says Elasticsearch
    assert detect_distribution(canned(root_reply(200, ES9_ROOT))) == "elasticsearch"
    # a secured cluster without credentials still names itself in the header
    locked = canned(root_reply(401, {"error": "auth"}, {"X-Elastic-Product": "Elasticsearch"}))
    assert detect_distribution(locked) == "elasticsearch"


def test_opensearch_is_detected_even_with_the_elastic_header(
    canned: Callable[[Handler], str],
) -> None:
    assert detect_distribution(canned(root_reply(200, OS2_ROOT))) == "opensearch"
    osmem_like = canned(root_reply(200, OS2_ROOT, {"X-Elastic-Product": "Elasticsearch"}))
    assert detect_distribution(osmem_like) == "opensearch"


def test_detection_errors_say_what_answered(canned: Callable[[Handler], str]) -> None:
    old = dict(ES9_ROOT, version={"number": "7.17.0"})
    with pytest.raises(EngineError, match=r"Elasticsearch 7\.17\.0 .* needs the elasticsearch 7"):
        detect_distribution(canned(root_reply(200, old, {"X-Elastic-Product": "Elasticsearch"})))
    with pytest.raises(EngineError, match="neither Elasticsearch nor OpenSearch"):
        detect_distribution(canned(root_reply(200, {"hello": "world"})))
    with pytest.raises(EngineError, match="refused GET / \\(401\\)"):
        detect_distribution(canned(root_reply(401, {"error": "Unauthorized"})))
    with pytest.raises(EngineUnavailable, match="503"):
        detect_distribution(canned(root_reply(503, {"error": "starting"})))


def test_credentials_are_sent_and_never_shown(canned: Callable[[Handler], str]) -> None:
    seen: list[str | None] = []

    def handler(method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Reply:
        seen.append(headers.get("Authorization"))
        return 200, {}, OS2_ROOT

    url = canned(handler)
    authed = url.replace("http://", "http://admin:s%40cret@")
    assert detect_distribution(authed) == "opensearch"
    assert seen == ["Basic YWRtaW46c0BjcmV0"]  # admin:s@cret
    assert redact_url(authed) == url.replace("http://", "http://admin:***@")
    eng = OpenSearchEngine(authed)
    assert "cret" not in repr(eng)
    eng.close()


# Item classification and versions, through both clients ---------------------------
def test_item_results_are_classified(engine: HttpEngine) -> None:
    results = engine.bulk(
        [
            op("a", BIG + 1),
            op("a", BIG),  # older: 409 version conflict
            op("a", BIG + 1),  # equal: also a conflict
            op("b", 7, bogus=1),  # strict mapping
            op("c", 7, flavor_vcpus="many"),  # not a long
            op("d", 7, display_name="d"),
        ]
    )
    statuses = [r.status for r in results]
    assert statuses == [
        WriteStatus.OK,
        WriteStatus.STALE,
        WriteStatus.STALE,
        WriteStatus.REJECTED,
        WriteStatus.REJECTED,
        WriteStatus.OK,
    ]
    assert results[3].reason and "strict_dynamic_mapping_exception" in results[3].reason
    assert "[bogus]" in results[3].reason
    assert results[4].reason and "flavor_vcpus" in results[4].reason
    assert engine.get("instance", "b") is None


def test_bulk_requests_in_flight_each_keep_a_pooled_connection(
    engine: HttpEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """With fewer pooled connections than requests in flight, urllib3 opens a connection
    for each extra request, drops it afterwards and warns every time (opensearch-py kept
    one: the bulk sync to osmem logged 63 warnings)."""
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    in_flight = engine.capabilities.max_in_flight
    assert in_flight > 1
    batches = [[op(f"{b}-{i}", 1) for i in range(100)] for b in range(10 * in_flight)]
    futures = [engine.submit_bulk(batch) for batch in batches]
    assert all(r.status is WriteStatus.OK for f in futures for r in f.result())
    assert [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"] == []


def test_versions_above_2_53_are_kept_exactly(engine: HttpEngine) -> None:
    assert float(BIG) == float(BIG + 1)  # what a double would merge
    assert engine.bulk([op("a", BIG), op("b", BIG + 2)])[0].status is WriteStatus.OK
    # one more than stored, in the low bits a double cannot hold: still newer
    assert engine.bulk([op("a", BIG + 1)])[0].status is WriteStatus.OK
    assert engine.bulk([op("a", BIG)])[0].status is WriteStatus.STALE
    stored = engine.get("instance", "a")
    assert stored is not None and stored.version == BIG + 1
    assert stored.document["version"] == BIG + 1
    assert engine.get_many("instance", ["a", "b"])["b"].version == BIG + 2
    engine.refresh("instance")
    assert list(engine.iter_versions("instance", batch_size=1)) == [("a", BIG + 1), ("b", BIG + 2)]


def test_bulk_load_settings_are_restored(engine: HttpEngine) -> None:
    live = engine.indexes("instance")[0].name
    engine._send("PUT", f"/{live}/_settings", body={"index": {"number_of_replicas": 2}})
    name = engine.new_index_name("instance")
    engine.create_index("instance", name, bulk_load=True)
    settings = engine._send("GET", f"/{name}/_settings")[name]["settings"]["index"]
    assert settings["refresh_interval"] == "-1" and settings["number_of_replicas"] == "0"
    results = list(engine.bulk_index(name, iter([op("a", 3), op("a", 2), op("b", 1, bogus=1)])))
    assert [r.status for r in results] == [WriteStatus.OK, WriteStatus.STALE, WriteStatus.REJECTED]
    engine.finish_bulk_load(name)
    settings = engine._send("GET", f"/{name}/_settings")[name]["settings"]["index"]
    assert settings["refresh_interval"] == "1s" and settings["number_of_replicas"] == "2"


def test_bulk_index_refuses_a_missing_index(engine: HttpEngine) -> None:
    with pytest.raises(IndexMissing):
        list(engine.bulk_index("t-instance-nosuch", iter([op("a", 1)])))
    # and did not create it with a dynamic mapping on the way
    assert engine.indexes("instance")[0].name != "t-instance-nosuch"
    with pytest.raises(IndexMissing):
        engine._send("GET", "/t-instance-nosuch")


def test_meta_index_is_strict_and_created_on_demand(engine: HttpEngine) -> None:
    assert engine.get_meta("purge_floor:instance") is None
    engine.put_meta("purge_floor:instance", {"at": "2026-01-01T00:00:00Z", "n": BIG})
    assert engine.get_meta("purge_floor:instance") == {"at": "2026-01-01T00:00:00Z", "n": BIG}
    mappings = engine._send("GET", f"/{engine.meta_alias()}/_mapping")
    (mapping,) = (m["mappings"] for m in mappings.values())
    assert mapping["dynamic"] == "strict"
    assert all("meta" not in i.name for i in engine.indexes("instance"))


def test_missing_aliases_are_index_missing(kind: str, osmem_url: str) -> None:
    eng = make_engine(kind, osmem_url, prefix="none")
    try:
        with pytest.raises(IndexMissing):
            eng.bulk([op("a", 1)])
        with pytest.raises(IndexMissing):
            eng.get("instance", "a")
        with pytest.raises(IndexMissing):
            eng.count("instance")
    finally:
        eng.close()


def test_es_compat_rewrites_only_the_compatibility_media_types() -> None:
    assert plain_mimetype("application/vnd.elasticsearch+json; compatible-with=9") == (
        "application/json"
    )
    assert plain_mimetype("application/vnd.elasticsearch+x-ndjson;compatible-with=8") == (
        "application/x-ndjson"
    )
    assert plain_mimetype("application/json") == "application/json"


def test_an_index_dropped_between_listing_and_counting_is_left_out(
    engine: HttpEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sync retiring an index while `index status` or the API's probe lists them.
    engine.ensure_ready("instance")
    (serving,) = [i.name for i in engine.indexes("instance")]
    retiring = f"{engine.prefix}-instance-retiring"
    engine.create_index("instance", retiring, bulk_load=False)
    send = engine._send
    dropped: list[str] = []

    def racing(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        answer = send(method, path, *args, **kwargs)
        if method == "GET" and path.endswith("-*") and not dropped:
            dropped.append(retiring)
            engine.drop_index(retiring)  # for real, after the listing named it
        return answer

    monkeypatch.setattr(engine, "_send", racing)
    assert [i.name for i in engine.indexes("instance")] == [serving]
    assert dropped == [retiring]


def test_a_port_that_answers_but_not_in_http_is_named(tmp_path: Path) -> None:
    """A probe: a peer answering raw bytes was an internal error (BadStatusLine) whose
    message was those bytes, control characters and all."""
    import threading

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            peer, _ = server.accept()
            with peer:
                peer.recv(65536)
                peer.sendall(b"\x00\xff garbage bytes not http\r\n\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        with pytest.raises(EngineError) as refused:
            detect_distribution(f"http://127.0.0.1:{port}")
        thread.join(10)
    message = str(refused.value)
    assert "answered GET /, but not in HTTP (BadStatusLine)" in message
    assert "search_url" in message and "\x00" not in message and "garbage" not in message


def test_a_ping_given_a_timeout_waits_no_longer(kind: str) -> None:
    """A probe: the API's yardstick pinged a frozen engine with the engine's whole request
    timeout, so the request that found it took twice its search timeout (10 s)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog and are never answered
        eng = make_engine(kind, f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=60.0)
        done = threading.Event()
        failed: list[BaseException] = []

        def ping() -> None:
            try:
                eng.ping(timeout=0.3)
            except BaseException as exc:
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=ping, daemon=True).start()
        assert done.wait(10), "the ping waited on past its own timeout"
        eng.close()
    assert len(failed) == 1 and isinstance(failed[0], EngineUnavailable), failed
