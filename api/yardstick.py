"""After a search of ours timed out: does the engine answer an ordinary search in time?

A search slow by its own cost (a member's costly regexes) must not count against the
engine, or three such requests at once sent every client to the cells (a
resource-exhaustion probe). The yardstick is an ordinary search: the first instance in
Nova's default order, as an administrator lists. One runs at a time: the searches that
timed out meanwhile take its answer, so a burst of costly requests adds one yardstick
to the engine's load, not one each beside the admitted searches (a review).
"""

from __future__ import annotations

import threading
import time

from cellsight.api.sort_params import DEFAULT_ORDER
from cellsight.indexer.engines.base import EngineError, SearchEngine
from cellsight.query.tree import MatchAll, SearchRequest

YARDSTICK = SearchRequest(MatchAll(), DEFAULT_ORDER, 1)
# Seconds the engine's ping may take here: an engine that answers at all answers it at
# once, and a frozen one cost the request that found it twice its search timeout (a probe:
# 10 s at the default 5 s).
PING_TIMEOUT = 1.0


class Yardstick:
    def __init__(self, engine: SearchEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._last: tuple[float, bool | None] | None = None  # (ended at, answer)

    def answers(self) -> bool | None:
        """True if an ordinary search answers in time, False if only the engine's ping
        does, None if not even that. A yardstick that ended after this call began
        answers for it (it waited for that one to end)."""
        asked = time.monotonic()
        with self._lock:
            if self._last is not None and self._last[0] >= asked:
                return self._last[1]
            answer = self._measure()
            self._last = (time.monotonic(), answer)
            return answer

    def _measure(self) -> bool | None:
        try:
            self.engine.ping(timeout=PING_TIMEOUT)
        except EngineError:
            return None
        try:
            self.engine.search("instance", YARDSTICK)
        except EngineError:
            return False
        return True
