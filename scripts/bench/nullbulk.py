"""A null bulk endpoint: just enough of the OpenSearch REST API for ``OpenSearchEngine``
(version info, index creation with aliases, alias and settings lookups, meta misses,
refresh, count) and a ``_bulk`` that parses each action line and answers success per
item, storing nothing. The indexer's own ceiling on the HTTP path is measured against
it, independently of a real cluster's (or osmem's) speed.

It runs in a process of its own (``NullBulkServer.start``), so its CPU is not taken from
the measured indexer's GIL, and parses and answers with orjson, so that on this 2-core
machine it takes as little as it can of the CPU the indexer and the broker share.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import orjson

VERSION = {
    "name": "nullbulk",
    "cluster_name": "nullbulk",
    "cluster_uuid": "nullbulk",
    "version": {
        "distribution": "opensearch",
        "number": "2.11.0",
        "lucene_version": "9.7.0",
        "minimum_wire_compatibility_version": "7.10.0",
        "minimum_index_compatibility_version": "7.0.0",
    },
    "tagline": "The OpenSearch Project: https://opensearch.org/",
}
SHARDS = {"total": 1, "successful": 1, "failed": 0}


class State:
    def __init__(self) -> None:
        self.created: dict[str, int] = {}  # index -> creation date (ms)
        self.aliases: dict[str, set[str]] = {}  # alias -> indexes
        self.ids: dict[str, set[str]] = {}  # index -> ids written
        self.mappings: dict[str, dict[str, Any]] = {}  # index -> its mapping
        self.items = 0
        self.requests = 0

    def resolve(self, target: str) -> list[str]:
        names: list[str] = []
        for part in target.split(","):
            names += sorted(self.aliases.get(part, set()))
            if part in self.created:
                names.append(part)
        return names


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    # The headers and the body go out in two writes; with Nagle's algorithm the body
    # waits for the client's delayed ACK of the headers (about 40 ms on Linux), which
    # capped this endpoint near 20,000 docs/s whatever the client did. Real engines
    # (and urllib3 on the client side) set TCP_NODELAY too.
    disable_nagle_algorithm = True
    state: State

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        raw = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_HEAD(self) -> None:
        self._answer(200, {})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, method: str) -> None:
        body = self._body()
        st = self.state
        st.requests += 1
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        if not parts:
            return self._answer(200, VERSION)
        if parts[-1] == "_bulk":
            return self._answer(200, self._bulk(body))
        if parts[0] == "_alias" and method == "GET":
            found: dict[str, Any] = {
                index: {
                    "aliases": {
                        a: {} for a in parts[1].split(",") if index in st.aliases.get(a, ())
                    }
                }
                for index in st.resolve(parts[1])
            }
            if not found:
                return self._answer(404, {"error": f"alias [{parts[1]}] missing", "status": 404})
            return self._answer(200, found)
        if len(parts) == 1 and method == "PUT":
            st.created[parts[0]] = int(time.time() * 1000)
            spec = orjson.loads(body) if body else {}
            st.mappings[parts[0]] = spec.get("mappings", {})
            for alias in spec.get("aliases", {}):
                st.aliases.setdefault(alias, set()).add(parts[0])
            return self._answer(200, {"acknowledged": True, "index": parts[0]})
        if len(parts) == 1 and method == "DELETE":
            st.created.pop(parts[0], None)
            for indexes in st.aliases.values():
                indexes.discard(parts[0])
            return self._answer(200, {"acknowledged": True})
        if len(parts) == 1 and method == "GET":
            return self._answer(200, {})  # no index listings: nothing is stored
        if len(parts) >= 2 and parts[1] == "_settings":
            return self._answer(
                200,
                {
                    i: {"settings": {"index": {"creation_date": str(st.created[i])}}}
                    for i in st.resolve(parts[0])
                },
            )
        if len(parts) == 2 and parts[1] == "_mapping":  # the writer adds missing fields
            if method == "PUT":
                for i in st.resolve(parts[0]):
                    props = st.mappings.setdefault(i, {}).setdefault("properties", {})
                    props.update(orjson.loads(body).get("properties", {}))
                return self._answer(200, {"acknowledged": True})
            return self._answer(
                200, {i: {"mappings": st.mappings.get(i, {})} for i in st.resolve(parts[0])}
            )
        if len(parts) >= 2 and parts[1] == "_doc" and method == "GET":
            return self._answer(404, {"_index": parts[0], "_id": parts[-1], "found": False})
        if parts[-1] == "_mget":  # nothing is stored, so nothing is found
            spec = orjson.loads(body) if body else {}
            asked = [(parts[0], i) for i in spec.get("ids", [])] + [
                (d["_index"], d["_id"]) for d in spec.get("docs", [])
            ]
            return self._answer(
                200, {"docs": [{"_index": x, "_id": i, "found": False} for x, i in asked]}
            )
        if parts[-1] == "_refresh":
            return self._answer(200, {"_shards": SHARDS})
        if parts[-1] == "_count":
            count = sum(len(st.ids.get(i, ())) for i in st.resolve(parts[0]))
            return self._answer(200, {"count": count, "_shards": SHARDS})
        return self._answer(400, {"error": {"type": "nullbulk", "reason": f"{method} {self.path}"}})

    def _bulk(self, body: bytes) -> dict[str, Any]:
        items = []
        lines = body.split(b"\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip():
                continue
            action = orjson.loads(line)
            op, meta = next(iter(action.items()))
            if op != "delete":
                i += 1  # the document line: not even parsed
            self.state.ids.setdefault(str(meta.get("_index")), set()).add(str(meta.get("_id")))
            items.append(
                {
                    op: {
                        "_index": meta.get("_index"),
                        "_id": meta.get("_id"),
                        "_version": meta.get("version", 1),
                        "result": "created",
                        "status": 201,
                        "_shards": SHARDS,
                        "_seq_no": self.state.items,
                        "_primary_term": 1,
                    }
                }
            )
            self.state.items += 1
        return {"took": 0, "errors": False, "items": items}


def serve(port_out: Any) -> None:
    """Child process: serve on a free loopback port, report it, until terminated."""
    Handler.state = State()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_out.send(server.server_address[1])
    server.serve_forever(poll_interval=0.5)


class NullBulkServer:
    def __init__(self, process: Any, port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def start(cls) -> NullBulkServer:
        ctx = mp.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        process = ctx.Process(target=serve, args=(send,), daemon=True, name="nullbulk")
        process.start()
        if not receive.poll(60):
            process.terminate()
            raise RuntimeError("the null bulk endpoint did not start")
        return cls(process, int(receive.recv()))

    def close(self) -> None:
        self.process.terminate()
        self.process.join(10)
