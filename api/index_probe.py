"""The search engine as the API sees it: possibly not connected yet, probed in the
background.

The API starts whatever the engine's state (unreachable, wrong credentials, missing
alias, embedded file missing or corrupt): ``DeferredEngine`` holds the engine once it
could be built, and until then every call raises ``EngineUnavailable``, which the
paths already treat as "serve from the cells". ``IndexProber`` (a daemon thread)
connects and asks whether the index is marked synced, on the safe-connect schedule;
a success clears the safe-connect flag, so the next request is served by the index.
Requests then never wait on an unreachable engine: only the prober talks to it while
the flag is set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cellsight.api.metrics import ApiMetrics
from cellsight.indexer.engines.base import EngineError, EngineUnavailable, SearchEngine

log = logging.getLogger(__name__)


class DeferredEngine:
    """Delegates to the engine ``build()`` returns, once it returned one."""

    def __init__(self, build: Callable[[], SearchEngine]) -> None:
        self._build = build
        self._engine: SearchEngine | None = None
        self._lock = threading.Lock()
        self.last_error = "not connected yet"

    @property
    def connected(self) -> bool:
        return self._engine is not None

    @property
    def distribution(self) -> str:
        return self._engine.distribution if self._engine is not None else "not connected"

    def connect(self) -> SearchEngine:
        """The engine, built now if it was not; raises ``EngineError`` if it cannot be."""
        with self._lock:
            if self._engine is None:
                try:
                    self._engine = self._build()
                except EngineError as exc:
                    self.last_error = f"{type(exc).__name__}: {str(exc)[:300]}"
                    raise
            return self._engine

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def __getattr__(self, name: str) -> Any:
        engine = self.__dict__.get("_engine")
        if engine is None:
            raise EngineUnavailable(f"search engine not connected ({self.last_error})")
        return getattr(engine, name)


class IndexProber:
    """Probes the index in the background: connect, then "is it marked synced?"."""

    def __init__(
        self,
        probe: Callable[[], str],
        next_delay: Callable[[], float],
        metrics: ApiMetrics,
        held: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._probe = probe
        self._next_delay = next_delay
        self._held = held
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_result = "not probed yet"
        self.last_probe_at: float | None = None
        self.first_probe_done = threading.Event()

    def start(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cellsight-index-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def probe_now(self) -> str:
        result = self._probe()
        self.last_result = result
        self.last_probe_at = time.time()
        self._metrics.probes.labels(result.split(":", 1)[0]).inc()
        return result

    def tick(self) -> float:
        """Probe if no failure holds probes back, then the seconds to the next tick. The
        wait was worked out before the sleep: a request's failure since then sets the
        safe-connect flag, whose cool-down (and its doubling, and 0's "until restart")
        the prober kept to only by chance before (it probed, and cleared the flag, on the
        schedule of the flag's absence: a probe)."""
        held = self._held()
        if held > 0:
            return held
        self.probe_now()
        return self._next_delay()

    def _run(self) -> None:
        delay = 0.0  # the first probe at start
        while not self._stop.wait(delay):
            try:
                delay = self.tick()
            finally:
                self.first_probe_done.set()

    def status(self) -> dict[str, Any]:
        return {
            "last_result": self.last_result,
            "last_probe_at": self.last_probe_at,
            "next_probe_in": round(self._next_delay(), 3),
        }
