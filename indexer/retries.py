"""Retries of transient engine failures for bulk sync and anti-entropy, one policy: a
sync's bulk writes (``sync_loader``), the steps around its load (``sync``), and the
versioned repairs of ``index verify --repair`` and of a sync's catch-up (``verify``).

A sync that met one timeout used to fail, throwing away the load so far; a sync that
retries forever would hold its lock through an outage. So: a bounded number of retries
with exponential backoff and jitter, then the failure as it was. Only
``EngineUnavailable`` (a timeout, a refused connection, 408, 429, 5xx, a busy embedded
index) is retried; its class, not its text, says it is transient.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from cellsight.indexer.engines.base import EngineUnavailable, WriteOp, WriteResult, WriteStatus
from cellsight.indexer.sync_request import RETRY_BACKOFF

log = logging.getLogger(__name__)
T = TypeVar("T")

# Retries before the sync gives up: with the default backoff, about 24 s of waiting
# (0.5 s doubling up to 8 s), well inside the lock's TTL, besides the attempts.
RETRY_ROUNDS = 6
MAX_BACKOFF = 8.0
STOP_POLL = 0.1  # seconds between looks at the stop flag while backing off


class ItemsToRetry(EngineUnavailable):
    """Some items got 429/5xx: write those again after a backoff."""


class RetryStopped(Exception):
    """The sync began to stop while a retry waited: it is not made."""


def retrying(
    fn: Callable[[], T],
    what: str,
    *,
    backoff: float = RETRY_BACKOFF,
    stopped: Callable[[], bool] = lambda: False,
    transient: type[EngineUnavailable] = EngineUnavailable,
) -> T:
    """``fn()``, called again after a transient engine failure (``EngineUnavailable``,
    ``ItemsToRetry`` among them) up to ``RETRY_ROUNDS`` times, ``backoff`` seconds
    doubling up to ``MAX_BACKOFF`` between tries; then that failure is raised. Any other
    error is raised at once: a refusal, a conflict or a missing index fails again.
    Callers pass only what may run twice (versioned writes, reads, alias changes
    computed from the current aliases): a request that timed out may have been applied.
    ``stopped`` ends a backoff early, with ``RetryStopped``, when the sync is stopping;
    ``transient`` narrows what is retried (``EngineTimeout``: not a refused connection)."""
    return Retrying(
        retry=retry_if_exception_type(transient),
        stop=stop_after_attempt(RETRY_ROUNDS + 1),
        # The jitter keeps workers that failed together from coming back together.
        wait=wait_exponential(multiplier=backoff, max=MAX_BACKOFF) + wait_random(0, backoff),
        sleep=_pause(stopped),
        before_sleep=warn_before_retry(log, what, RETRY_ROUNDS),
        reraise=True,
    )(fn)


def write_retrying(
    send: Callable[[list[WriteOp]], Sequence[WriteResult]],
    ops: list[WriteOp],
    what: str,
    *,
    backoff: float = RETRY_BACKOFF,
    stopped: Callable[[], bool] = lambda: False,
) -> list[tuple[WriteOp, WriteResult]]:
    """Each op with its final result. A request that failed transiently is sent again,
    and so are the items the engine asked to retry (``retrying``). Versions are
    external, so what a timed-out request did store answers STALE the second time.
    Items still asked to retry after the last round keep that result; a request still
    failing after it raises."""
    done: list[tuple[WriteOp, WriteResult]] = []
    left: list[tuple[WriteOp, WriteResult]] = []
    pending = ops

    def attempt() -> None:
        nonlocal pending, left
        results = send(pending)
        left = []
        for op, result in zip(pending, results, strict=True):
            (left if result.status is WriteStatus.RETRY else done).append((op, result))
        if left:
            pending = [op for op, _ in left]
            raise ItemsToRetry(f"{len(left)} of {len(results)} items must be retried")

    try:
        retrying(attempt, what, backoff=backoff, stopped=stopped)
    except ItemsToRetry:
        done.extend(left)
    return done


def _pause(stopped: Callable[[], bool]) -> Callable[[float], None]:
    def pause(seconds: float) -> None:
        # Polled rather than one sleep: a sync stopping (another cell failed, Ctrl-C)
        # must not wait out a worker's backoff, nor let it make one more attempt.
        deadline = time.monotonic() + seconds
        while not stopped():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, STOP_POLL))
        raise RetryStopped("stopped while waiting to retry an engine request")

    return pause


def warn_before_retry(
    logger: logging.Logger, what: str, rounds: int | None = None
) -> Callable[[RetryCallState], None]:
    """tenacity's ``before_sleep``: one line naming the step, the failure and the wait
    (tenacity's own names the function, which a lambda leaves as ``<unknown>``), and with
    ``rounds`` which retry of how many it is."""

    def warn(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        tries = "retrying" if rounds is None else f"retry {state.attempt_number} of {rounds}"
        logger.warning(
            "%s failed (%s: %s); %s in %.1f s", what, type(error).__name__, error, tries, wait
        )

    return warn
