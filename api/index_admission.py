"""How many index searches run at once, and how many of them one project may hold.

A process starved of CPU by a hundred clients ran searches past ``search_timeout`` for
that alone, answered them from the cells as well (adding work where there was too much)
and reported healthy cells as timed out: a resource-exhaustion probe. So index searches
take one of ``index_searches`` slots, waiting up to the admission wait, and a request
that finds none gets a 503 with ``Retry-After`` (``fanout.Saturated``). One project (a
caller who is no administrator) may hold at most half of them, so a member keeping its
costly searches running cannot take the index away from every other caller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cellsight.api.fanout import Admission, Saturated
from cellsight.api.metrics import ApiMetrics


@dataclass
class _Project:
    admission: Admission
    holders: int = 0  # its searches admitted or waiting


class IndexAdmission:
    def __init__(self, slots: int, wait: float, metrics: ApiMetrics) -> None:
        self.slots = slots
        self.wait = wait
        self.metrics = metrics
        self.per_project = max(1, slots // 2)
        self._all = Admission(slots)
        self._lock = threading.Lock()
        self._projects: dict[str, _Project] = {}

    @contextmanager
    def admitted(self, project: str | None) -> Iterator[None]:
        """A slot for one search (``project``: the member's; None for an administrator),
        or ``Saturated`` once the wait is over."""
        deadline = time.monotonic() + self.wait
        own = self._enter(project) if project is not None else None
        try:
            if own is not None and not own.admission.acquire(1, self.wait):
                self._refused("this project's searches")
            try:
                if not self._all.acquire(1, max(0.0, deadline - time.monotonic())):
                    self._refused("other searches")
                self.metrics.index_admission.labels("admitted").inc()
                try:
                    yield
                finally:
                    self._all.release(1)
            finally:
                if own is not None:
                    own.admission.release(1)
        finally:
            if own is not None and project is not None:
                self._leave(project, own)

    def _refused(self, busy_with: str) -> None:
        self.metrics.index_admission.labels("refused").inc()
        raise Saturated(1, busy_with)

    def _enter(self, project: str) -> _Project:
        with self._lock:
            own = self._projects.get(project)
            if own is None:
                own = self._projects[project] = _Project(Admission(self.per_project))
            own.holders += 1
            return own

    def _leave(self, project: str, own: _Project) -> None:
        """A project is remembered only while one of its searches is admitted or waits."""
        with self._lock:
            own.holders -= 1
            if own.holders == 0:
                del self._projects[project]
