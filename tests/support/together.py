"""Jobs started at one moment on threads of their own, for the concurrency tests."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import pytest


def run_together(
    jobs: Sequence[Callable[[int], None]], caplog: pytest.LogCaptureFixture
) -> tuple[list[BaseException], list[str]]:
    """Run ``jobs[n](n)`` on one thread each, released together; what they raised, and
    the transactions the cells ran again as a deadlock's victims (``retry_conflicts``
    logs each at INFO)."""
    failures: list[BaseException] = []
    start = threading.Barrier(len(jobs))

    def run(job: Callable[[int], None], n: int) -> None:
        start.wait()
        try:
            job(n)
        except BaseException as exc:  # the caller asserts on them
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(job, n)) for n, job in enumerate(jobs)]
    with caplog.at_level(logging.INFO, logger="cellsight.cells.database"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    retried = [r.getMessage() for r in caplog.records if "running it again" in r.getMessage()]
    return failures, retried
