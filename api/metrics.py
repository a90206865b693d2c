"""Prometheus metrics of one API app (its own registry, served at ``/metrics``), and the
once-per-kind logging of our own bugs that a fall-back hid from the client."""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry, Counter, Histogram


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
        self.cell_queries = Histogram(
            "cellsight_api_cell_query_seconds",
            "One cell's query on the fan-out path, from its start",
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
