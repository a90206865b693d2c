"""The engine's writes alone: the documents mapped before the clock starts.

* **ceiling**: ``engine.bulk`` of them, in batches of the consumer's size.
* **floor** (the embedded engine): their rows, also built before the clock, through the
  same SQL with nothing else (``bench/floor.py``): what the ceiling cannot beat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.measure import Tally
from cellsight.indexer.engines.base import WriteOp, WriteResult, WriteStatus
from cellsight.indexer.writer import merge_tags, plan


def ceiling_chunk(
    write: Callable[[Any], Any],
    bodies: Sequence[bytes],
    batch: int,
    tally: Tally,
    prepare: Callable[[list[WriteOp]], Any] = list,
    count: Callable[[Any], int] = int,
) -> int:
    """``write`` of these notifications' documents in batches of the consumer's size:
    ``engine.bulk`` for the ceiling, the floor's SQL for the floor. What it writes is
    mapped (and, by ``prepare``, made rows) before the clock starts, and what it returns
    is counted (``count``: how many it wrote) after the clock. Returns how many were
    written."""
    spent = cpu = 0.0
    written = 0
    for start in range(0, len(bodies), batch):
        _, planned = plan(bodies[start : start + batch])
        merge_tags(planned, {})  # what the indexer stores for new tag-less payloads
        items = prepare([p.op for p in planned])
        del planned
        t, c = time.perf_counter(), time.thread_time()
        done = write(items)
        spent += time.perf_counter() - t
        cpu += time.thread_time() - c
        written += count(done)
    tally.add(len(bodies), spent, cpu)
    return written


def taken(results: list[WriteResult]) -> int:
    """How many of ``engine.bulk``'s results were written."""
    return sum(r.status is WriteStatus.OK for r in results)
