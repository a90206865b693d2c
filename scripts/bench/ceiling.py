"""The engine's writes alone: the documents mapped before the clock starts.

* **ceiling**: ``engine.bulk`` of them, in batches of the consumer's size.
* **floor** (the embedded engine): their rows, also built before the clock, through the
  same SQL with nothing else (``bench/floor.py``): what the ceiling cannot beat.

Both run under the cycle-collector policy of the writer process they stand for
(``BatchCollector``: automatic collection off, a pass between batches when one is due).
Under automatic collection a pass runs every 700 net allocations and walks the batch's
live objects again, and the older passes everything the bench process holds (every
phase's notifications): measured in a process holding 20,000 notifications, 7.5-8.0 µs
of the ceiling's 50-53 µs of CPU a document (about 200 passes per 20,000 documents) was
the collector's, which the writer process does not pay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.measure import Tally
from cellsight.indexer.collector import BatchCollector
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
    is counted (``count``: how many it wrote) after the clock. Each write and the
    collector's pass after it, if one is due, are timed, as the writer process pays both
    (``write_child``). Returns how many were written."""
    spent = cpu = 0.0
    written = 0
    with BatchCollector() as collector:
        for start in range(0, len(bodies), batch):
            _, planned = plan(bodies[start : start + batch])
            merge_tags(planned, {})  # what the indexer stores for new tag-less payloads
            items = prepare([p.op for p in planned])
            del planned
            t, c = time.perf_counter(), time.thread_time()
            done = write(items)
            collector.batch_done()
            spent += time.perf_counter() - t
            cpu += time.thread_time() - c
            written += count(done)
    tally.add(len(bodies), spent, cpu)
    return written


def taken(results: list[WriteResult]) -> int:
    """How many of ``engine.bulk``'s results were written."""
    return sum(r.status is WriteStatus.OK for r in results)
