"""The ``engine`` fixture: every engine, so one contract suite runs unchanged on each;
``each_bus``: settings on each real bus (RabbitMQ, the embedded Redis bus).

``embedded`` is a fresh SQLite file. ``elasticsearch`` and ``opensearch`` run against a
per-test clone of the session's osmem server (an in-memory OpenSearch-compatible
server); the Elasticsearch client reaches it through ``tests.support.es_compat``. Every
engine gets a unique prefix, so nothing a test leaves behind can leak into another.

For the HTTP engine tests: ``kind``, each HTTP engine's name; ``canned``, a small local
HTTP server with canned answers.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.settings import Settings
from tests.support.http_engines import make_engine
from tests.support.indexing import bus_settings
from tests.support.redis_envelopes import embedded_settings  # noqa: F401  (fixture settings_)
from tests.support.services import osmem_clone_url

if TYPE_CHECKING:
    from tests.support.http_engines import Handler

ENGINES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("elasticsearch", id="elasticsearch", marks=pytest.mark.services),
    pytest.param("opensearch", id="opensearch", marks=pytest.mark.services),
]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SearchEngine]:
    kind = str(request.param)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if kind == "embedded":
        eng: SearchEngine = EmbeddedEngine(tmp_path / "index.db", prefix=prefix)
    else:
        eng = make_engine(kind, osmem_clone_url(request), prefix=prefix, timeout=10.0)
    yield eng
    eng.close()


@pytest.fixture(params=["rabbitmq", "embedded"])
def each_bus(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Settings on RabbitMQ (a stream of the test's own) or the embedded bus in tmp_path."""
    if request.param == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")
    return bus_settings(tmp_path / "data", str(request.param))


KINDS = ("opensearch", "elasticsearch")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# A canned HTTP server ---------------------------------------------------------
@pytest.fixture
def canned() -> Iterator[Callable[[Handler], str]]:
    """Serve ``handler(method, path, headers, body) -> (status, headers, json)``; gives
    its URL."""
    servers: list[ThreadingHTTPServer] = []

    def serve(handler: Handler) -> str:
        class Answer(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, headers, body = handler(
                    self.command, self.path, dict(self.headers), self.rfile.read(length)
                )
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def embedded_index(tmp_path: Path) -> Iterator[EmbeddedEngine]:
    """An empty embedded instance index, for the tests of one bus path (not a contract)."""
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    yield engine
    engine.close()
