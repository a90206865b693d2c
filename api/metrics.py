"""Prometheus metrics of one API app (its own registry, served at ``/metrics``), and the
once-per-kind logging of our own bugs that a fall-back hid from the client."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# ``headers.PATH`` as ASGI carries it (lower case, bytes); headers imports the fan-out,
# which imports this module, hence the literal (a test keeps the two equal).
PATH_HEADER = b"x-cellsight-path"


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.paths = Counter(
            "cellsight_api_path_decisions",
            "Listings by the path that answered and why",
            ["path", "reason"],
            registry=self.registry,
        )
        self.probes = Counter(
            "cellsight_api_index_probes",
            "Background probes of the search index by result",
            ["result"],
            registry=self.registry,
        )
        self.bug_fallbacks = Counter(
            "cellsight_api_bug_fallbacks",
            "Fall-backs to the cells caused by errors that are not unavailability (bugs)",
            ["where", "kind"],
            registry=self.registry,
        )
        self.admission = Counter(
            "cellsight_api_fanout_admission",
            "Fan-out requests admitted or refused (pool saturated)",
            ["result"],
            registry=self.registry,
        )
        self.index_admission = Counter(
            "cellsight_api_index_admission",
            "Index searches admitted or refused (index_searches at once)",
            ["result"],
            registry=self.registry,
        )
        self.cell_queries = Histogram(
            "cellsight_api_cell_query_seconds",
            "One cell's query on the fan-out path, from its start",
            registry=self.registry,
        )
        self.requests = Histogram(
            "cellsight_api_request_seconds",
            "Request latency by the path that answered (index, fanout; none: not a listing)",
            ["path"],
            registry=self.registry,
        )
        self.cells_skipped = Counter(
            "cellsight_api_cells_skipped",
            "Cells a fan-out skipped (timeout or error), by cell",
            ["cell", "reason"],
            registry=self.registry,
        )
        self.safe_connect = Gauge(
            "cellsight_api_safe_connect_active",
            "1 while the safe-connect flag keeps listings off the index",
            registry=self.registry,
        )
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def bug(self, where: str, exc: BaseException, log: logging.Logger) -> None:
        """Count a bug a fall-back hid; log its traceback the first time of its kind."""
        kind = type(exc).__qualname__
        self.bug_fallbacks.labels(where, kind).inc()
        with self._lock:
            first = (where, kind) not in self._logged
            self._logged.add((where, kind))
        if first:
            log.error("%s: unexpected %s (logged once per kind)", where, kind, exc_info=exc)


class RequestTimer:
    """ASGI middleware: each HTTP request's latency into ``cellsight_api_request_seconds``,
    labelled by the ``X-Cellsight-Path`` the response carries (a plain ASGI wrapper, not
    Starlette's ``BaseHTTPMiddleware``, so large listings are not buffered twice)."""

    def __init__(self, app: Any, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        begun = time.perf_counter()
        path = "none"

        async def timed_send(message: Any) -> None:
            nonlocal path
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", ()):
                    if name.lower() == PATH_HEADER:
                        path = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.metrics.requests.labels(path).observe(time.perf_counter() - begun)
