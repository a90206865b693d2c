"""Decode + map CPU per notification: the compiled path against the reference path.

Prints JSON. Every figure is CPU time (``time.process_time``) per notification over the
same oslo-wrapped bodies in the same run: ``orjson_baseline`` parses the wrapper and the
inner message with orjson and nothing else (the parsing floor); ``reference`` is the
pydantic decoder and mapping (``cellsight.notifications.envelope.decode`` +
``cellsight.indexer.documents.instance_document``), ``fast`` the msgspec decoder and one-pass
mapping the indexer uses. Bodies: realistic generated notifications of every instance
event kind (``tests/support/novagen.py``), about 3 KB each.

``fast_plan_dropped`` is the planning step per message (``plan_fast``), each result
dropped at once as the two above; ``fast_plan_batches`` is the indexer's whole planning
step (``writer.plan``: decode, map, version, plan) over batches of the consumer's size,
each batch's plans kept while the next is planned, as the pipeline keeps a batch being
written and one ready, under the indexer's collector policy. Kept objects are not reused
hot from the cache by the next notification's allocations, so it costs more than the
others, whose results are dropped at once: the same gap as between this benchmark and
the planning stage measured in the running indexer (``bench_indexer.py``).

    .venv/bin/python scripts/bench_decode.py [--count 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from bench.targets import summary, target

from cellsight.indexer import fastmap
from cellsight.indexer.collector import BatchCollector
from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.documents import event_version, instance_document
from cellsight.indexer.planning import plan, plan_fast
from cellsight.notifications.envelope import decode
from cellsight.notifications.fastdecode import decode_fast
from tests.support import novagen

TARGET_US = 25  # issue 11: decode + map, CPU µs a notification


def bodies(count: int) -> list[bytes]:
    kinds = list(novagen.EVENT_CLASSES)
    return [novagen.body(novagen.notification(kinds[i % len(kinds)], seed=i)) for i in range(count)]


def cpu_us(fn: Callable[[Any], Any], items: list[Any], rounds: int) -> float:
    """Best of ``rounds`` (the least disturbed by other load), µs per item."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for item in items:
            fn(item)
        best = min(best, time.process_time() - started)
    return best / len(items) * 1e6


def plan_batches_us(items: list[bytes], rounds: int, held: int = 2) -> float:
    """``plan`` over batches of the consumer's size, the last ``held`` batches' plans
    kept alive; best of ``rounds``, µs per item."""
    size = ConsumerConfig().batch_count
    best = float("inf")
    with BatchCollector() as collector:
        for _ in range(rounds):
            kept: deque[Any] = deque(maxlen=held)
            started = time.process_time()
            for start in range(0, len(items), size):
                kept.append(plan(items[start : start + size]))
                collector.batch_done()
            best = min(best, time.process_time() - started)
    return best / len(items) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    items = bodies(args.count)

    ref_decoded = [decode(b) for b in items]
    fast_decoded = [decode_fast(b) for b in items]

    def ref_map(n: Any) -> Any:
        return instance_document(
            n.payload, n.event_type, event_version(n.payload, n.event, n.timestamp)
        )

    stamp = fastmap.now()  # the indexer stamps indexed_at once per batch

    def fast_map(n: Any) -> Any:
        return fastmap.instance_document(n, fastmap.instance_version(n)[0], stamp)

    figures = {
        "orjson_baseline": cpu_us(
            lambda b: orjson.loads(orjson.loads(b)["oslo.message"]), items, args.rounds
        ),
        "reference_decode": cpu_us(decode, items, args.rounds),
        "reference_map": cpu_us(ref_map, ref_decoded, args.rounds),
        "fast_decode": cpu_us(decode_fast, items, args.rounds),
        "fast_map": cpu_us(fast_map, fast_decoded, args.rounds),
        # The planning step per message, its result dropped at once like the two above.
        "fast_plan_dropped": cpu_us(lambda b: plan_fast(0, b, stamp), items, args.rounds),
        "fast_plan_batches": plan_batches_us(items, args.rounds),
    }
    reference = figures["reference_decode"] + figures["reference_map"]
    fast = figures["fast_decode"] + figures["fast_map"]
    out = {
        "notifications": args.count,
        "body_bytes_mean": round(sum(map(len, items)) / len(items)),
        "us_per_notification": {k: round(v, 2) for k, v in figures.items()},
        "reference_decode_map_us": round(reference, 2),
        "fast_decode_map_us": round(fast, 2),
        "speedup_vs_reference": round(reference / fast, 2),
        "fast_vs_orjson_parse_ratio": round(fast / figures["orjson_baseline"], 2),
    }
    out["targets"] = [target("decode_map_us", out["fast_decode_map_us"], TARGET_US, "<=")]
    out.update(summary(out["targets"]))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
