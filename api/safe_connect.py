"""The safe-connect flag: after an index failure, serve from the cells for a while.

The first failure (connection refused, timeout, 5xx, missing alias) logs one warning
and sets the flag; the request that failed is answered by fan-out, and while the flag
is set no request touches the index. After ``cooldown`` seconds one request (only one,
however many arrive) probes the index again: success clears the flag, failure doubles
the wait, up to ``max_cooldown``. ``cooldown == 0`` keeps the flag until restart (the
original design). Thread-safe: requests run in a thread pool.

A search that ran past its timeout while the engine answers an ordinary search in
time is a heavy query, not an outage: that request is answered by fan-out and nothing
is counted, so one member's costly filters do not send every listing to the cells
(``yardstick.Yardstick``). If the ordinary search is slow too (``slow``),
``SLOW_TRIPS`` such searches in a row with no search answered in between set the flag
as a failure does: an engine slow for everyone is left alone for a while too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SLOW_TRIPS = 3


class SafeConnect:
    def __init__(
        self,
        cooldown: float,
        *,
        max_cooldown: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cooldown = cooldown
        # False while a background prober runs: requests then never wait on the engine.
        self.request_probes = True
        self.max_cooldown = (
            max_cooldown if max_cooldown is not None else max(cooldown * 16, cooldown)
        )
        self.clock = clock
        self._lock = threading.Lock()
        self._set = False
        self._reason = ""
        self._since = 0.0
        self._failures = 0
        self._next_probe = 0.0
        self._probing = False
        self._slow = 0  # searches past their timeout since the last one answered

    @property
    def flagged(self) -> bool:
        return self._set

    def use_index(self) -> bool:
        """Whether this request may try the index (at most one probe at a time)."""
        return self.try_index()[0]

    def try_index(self) -> tuple[bool, bool]:
        """``use_index``, and whether this request is then the probe (which must end in
        ``failed``, ``succeeded`` or ``release_probe``)."""
        with self._lock:
            if not self._set:
                return True, False
            if (
                not self.request_probes
                or self.cooldown == 0
                or self._probing
                or self.clock() < self._next_probe
            ):
                return False, False
            self._probing = True
            return True, True

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            now = self.clock()
            self._probing = False
            self._failures += 1
            self._reason = f"{type(exc).__name__}: {str(exc)[:300]}"
            if not self._set:
                self._set = True
                self._since = now
                log.warning(
                    "search index failed (%s); serving from the cells%s",
                    self._reason,
                    " until restart"
                    if self.cooldown == 0
                    else f", re-probing in {self.cooldown:g}s",
                )
            wait = min(self.cooldown * 2 ** (self._failures - 1), self.max_cooldown)
            self._next_probe = now + wait

    def slow(self, exc: BaseException) -> bool:
        """A search past its timeout on an engine that answers a ping, but an ordinary
        search in time neither: whether the flag is now set (a probe's slow answer keeps
        it; ``SLOW_TRIPS`` in a row set it)."""
        with self._lock:
            self._slow += 1
            trips = self._set or self._slow >= SLOW_TRIPS
        if trips:
            self.failed(exc)
        return trips

    def succeeded(self, *, searched: bool = True) -> None:
        """The index answered: clears the flag. Only a search (not the background probe,
        which reads its records) also clears the count of slow searches and failures: an
        engine that answers the probe while every search runs past its timeout would
        otherwise never be left alone, however slow, and its backoff never grow."""
        with self._lock:
            if searched:
                self._slow = 0
                self._failures = 0
            if self._set:
                log.warning("search index answers again; serving from the index")
            self._set = False
            self._probing = False
            self._reason = ""

    def next_probe_in(self) -> float | None:
        """Seconds to the next probe while the flag is set, else None."""
        with self._lock:
            if not self._set:
                return None
            return max(0.0, self._next_probe - self.clock())

    def release_probe(self) -> None:
        """A probe that ended without an answer either way (e.g. not synced)."""
        with self._lock:
            self._probing = False

    def status(self) -> dict[str, Any]:
        with self._lock:
            if not self._set:
                return {"flag": False}
            now = self.clock()
            return {
                "flag": True,
                "reason": self._reason,
                "failures": self._failures,
                "seconds_since_first_failure": round(now - self._since, 3),
                "next_probe_in": None
                if self.cooldown == 0
                else round(max(0.0, self._next_probe - now), 3),
            }
