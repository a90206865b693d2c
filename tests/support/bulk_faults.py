"""An HTTP proxy in front of a real engine (osmem) that spoils chosen ``_bulk`` requests
(or those of another endpoint, ``_search``): what a cluster under load does to a long
bulk sync, or to one heavy listing, one request at a time.

Every other request, and every bulk request not chosen, is forwarded as it came and
answered with the engine's own answer. Once ``arm``ed, a chosen one gets the fault:

* a status code (429, 503, 400, ...): answered at once, the engine never sees it;
* ``TIMEOUT``: forwarded (the engine applies it) and its answer withheld until the
  client gives up, so the client's retry finds the documents already written;
* bytes: answered at once with a 200 and those bytes as its body (empty, cut short);
* a float: forwarded, and the engine's answer sent that many seconds late (a slow link).

``bodies`` holds every bulk body since ``arm`` in arrival order, ``spoiled`` those that
got the fault: a test asserts how many times one batch was sent.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

TIMEOUT = "timeout"
WAIT = 30.0  # bound on withholding an answer (the client gives up long before)
# Connection-level headers: each hop has its own (http.client sets its framing).
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class BulkFaults:
    """``url`` (``http://127.0.0.1:<port>``) → ``target``, spoiling nothing until armed."""

    def __init__(self, target: str, endpoint: str = "/_bulk") -> None:
        parts = urlsplit(target)
        self.endpoint = endpoint
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.fault: int | str | bytes | float | None = None
        self.first = 0
        self.times: int | None = 0
        self.bodies: list[bytes] = []
        self.spoiled: list[bytes] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the clients' pools expect
            # The head and the body of an answer are two writes: with Nagle's algorithm
            # the second waits for the client's delayed ACK, 40 ms a request.
            disable_nagle_algorithm = True

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                fault = proxy._fault_for(self.path, body)
                if fault is None or fault == TIMEOUT or isinstance(fault, float):
                    status, headers, answer = proxy._forward(
                        self.command, self.path, self.headers, body
                    )
                    if isinstance(fault, float):
                        proxy._released.wait(fault)
                    elif fault == TIMEOUT:
                        proxy._released.wait(WAIT)  # the client times out meanwhile
                        self.close_connection = True
                        return
                elif isinstance(fault, bytes):  # a 200 whose body is this (empty, cut short)
                    status, headers, answer = 200, [("Content-Type", "application/json")], fault
                else:
                    status, headers = int(fault), [("Content-Type", "application/json")]
                    error = {"type": "injected_fault", "reason": f"injected {fault}"}
                    answer = json.dumps({"error": error, "status": status}).encode()
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def arm(self, fault: int | str | bytes | float, *, first: int, times: int | None = 1) -> None:
        """Bulk requests ``first`` to ``first + times - 1`` from now on (1-based; ``times``
        None: every one from ``first`` on) get ``fault``."""
        with self._lock:
            self.fault, self.first, self.times = fault, first, times
            self.bodies, self.spoiled = [], []

    def _fault_for(self, path: str, body: bytes) -> int | str | bytes | float | None:
        if self.endpoint not in path.split("?")[0]:
            return None
        with self._lock:
            if self.fault is None:
                return None
            self.bodies.append(body)
            n = len(self.bodies)
            chosen = n >= self.first and (self.times is None or n < self.first + self.times)
            if chosen:
                self.spoiled.append(body)
        return self.fault if chosen else None

    def _forward(
        self, method: str, path: str, headers: Any, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=WAIT)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in HOP}
            conn.request(method, path, body=body or None, headers=sent)
            answer = conn.getresponse()
            raw = answer.read()
            kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP]
            return answer.status, kept, raw
        finally:
            conn.close()

    def sent(self, body: bytes) -> int:
        """How many times ``body`` was sent."""
        with self._lock:
            return self.bodies.count(body)

    def close(self) -> None:
        self._released.set()
        self.server.shutdown()
        with contextlib.suppress(OSError):
            self.server.server_close()
