"""The hourly audit burst: one ``instance.exists`` per instance, indexed by the real
``cellsight indexer --workers N``. Issue 11's goal: a million instances indexed in under
two minutes by a couple of indexer processes.

    .venv/bin/python scripts/bench_audit.py [--count 1000000] [--workers 2]
        [--engine embedded|nullbulk] [--preloaded [--changed 0.1]]
        [--writer-docs 50000] [--writer-osmem 0] > result.json

JSON on stdout, progress on stderr.

* **decode**: the indexer's decode step (``planning.plan``, CPU µs per notification)
  over the same ``instance.exists`` bodies and, as the same run's baseline, over the
  known-class mix of ``bench_indexer``. ``instance_exists_reference_us`` is the
  pydantic decoder and mapping, which ``instance.exists`` took before the compiled
  decoder read Nova's other instance classes by shape.
* **writer**: the writer's side alone, in this process (``writer_figures``): CPU µs per
  notification of ``BatchWriter.commit`` over ``--writer-docs`` of them, into an index
  that already holds them and into an empty one; with ``--writer-osmem`` N, the
  preloaded case against osmem too (the client's CPU only).
* **burst**: ``--count`` notifications are published with confirms (not timed), then
  the command drains them (``bench/workers.py``). The clock runs from the moment all
  consumers are attached to the moment the index holds every document.
* ``--preloaded``: the hourly case. Before the command starts (untimed), its index is
  filled with the same instances as the previous hour's audit left them; in the burst
  ``--changed`` of them (a fraction) carry a newer snapshot and are written, the others
  are found stale. The clock then stops when the workers' metrics count every verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.bus import RABBITMQ
from bench.corpus import Corpus
from bench.measure import say
from bench.sites import EmbeddedSite, EngineSite, NullBulkSite, OsmemSite
from bench.targets import summary, target
from bench.workers import run_workers

from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.engines.base import SearchEngine, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.planning import EventInfo, map_payload, plan
from cellsight.indexer.writer import BatchWriter, merge_tags
from cellsight.notifications.envelope import decode

TARGET_SECONDS_PER_MILLION = 120.0


def cpu_us(fn: Callable[[Sequence[bytes]], Any], bodies: Sequence[bytes], rounds: int) -> float:
    """Best of ``rounds``, CPU µs per body."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        fn(bodies)
        best = min(best, time.process_time() - started)
    return round(best / len(bodies) * 1e6, 1)


def reference(bodies: Sequence[bytes]) -> None:
    for body in bodies:
        n = decode(body)
        map_payload(0, n.payload, n.event, EventInfo(n.event_type, n.timestamp))


def decode_figures(corpus: Corpus, audit: datetime, rounds: int) -> dict[str, Any]:
    now = time.time()
    exists = [corpus.exists(9_000_000 + i, now, audit) for i in range(2000)]
    mix = [corpus.body(9_000_000 + i, now) for i in range(2000)]
    outcomes, planned = plan(exists)
    if len(planned) != len(exists):
        raise RuntimeError(f"instance.exists not planned: {[o for o in outcomes if o][:1]}")
    fast, known = cpu_us(plan, exists, rounds), cpu_us(plan, mix, rounds)
    slow = cpu_us(reference, exists, max(1, rounds // 2))
    return {
        "instance_exists_plan_us": fast,
        "known_class_mix_plan_us": known,
        "exists_to_known_ratio": round(fast / known, 2),
        "instance_exists_reference_us": slow,
        "reference_to_plan_ratio": round(slow / fast, 2),
    }


def writer_figures(
    corpus: Corpus, audit: datetime, count: int, rounds: int, osmem_count: int
) -> dict[str, Any]:
    """The writer's side in this process (``BatchWriter.commit``, CPU µs per
    notification, every thread of this process, the embedded engine's checkpoint thread
    included): an index already holding ``count`` instances, then a tenth changed and
    the rest stale, in the consumer's batches of 1,000; and the same into an empty
    index. Best of ``rounds``, each on a new index. With ``osmem_count``, the preloaded
    case on osmem too: the client's side of the HTTP path (osmem's own CPU not counted)."""
    now = time.time()
    burst = [corpus.exists(i, now, audit, changed=i % 10 == 0) for i in range(count)]

    def commit_us(engine: SearchEngine, n: int, preload: bool) -> float:
        if preload:
            preloader(corpus, 0, n, audit)(engine)
        writer = BatchWriter(engine, record_metrics=False)
        # Planned afresh each round: the writer merges tags into the documents.
        todo = [plan(burst[i : min(i + 1000, n)]) for i in range(0, n, 1000)]
        started = time.process_time()
        for outcomes, planned in todo:
            writer.commit(outcomes, planned)
        return (time.process_time() - started) / n * 1e6

    figures: dict[str, Any] = {"documents": count}
    for case in ("preloaded", "empty"):
        best = float("inf")
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="cellsight-bench-") as tmp:
                engine = EmbeddedEngine(Path(tmp) / "index.db")
                best = min(best, commit_us(engine, count, case == "preloaded"))
                engine.close()
        figures[f"{case}_commit_us"] = round(best, 1)
    if osmem_count:
        on_osmem = min(osmem_count, count)  # the burst built above holds ``count``
        site = OsmemSite()
        try:
            best = float("inf")
            for r in range(rounds):
                on_site = site.fresh(f"writer{r}")
                best = min(best, commit_us(on_site, on_osmem, True))
                site.release(on_site)
            figures["osmem"] = {"documents": on_osmem, "preloaded_commit_us": round(best, 1)}
        finally:
            site.close()
    return figures


def preloader(
    corpus: Corpus, first: int, count: int, audit: datetime
) -> Callable[[SearchEngine], None]:
    """Fills an index with instances ``first`` .. ``first + count - 1`` as the previous
    hour's audit indexed them (through ``engine.bulk``, in the consumer's batches)."""

    def fill(engine: SearchEngine) -> None:
        engine.ensure_ready("instance")
        earlier, stamp = audit - timedelta(hours=1), time.time() - 3600
        for start in range(first, first + count, 1000):
            ids = range(start, min(start + 1000, first + count))
            _, planned = plan([corpus.exists(i, stamp, earlier) for i in ids])
            merge_tags(planned, {})
            results = engine.bulk([p.op for p in planned])
            if any(r.status is not WriteStatus.OK for r in results):
                raise RuntimeError("the preload was not all written")
        engine.refresh("instance")
        say(f"  preloaded {engine.count('instance'):,} instances")

    return fill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument(
        "--workers", default="2", help="comma-separated worker counts, in order; '': none"
    )
    p.add_argument("--engine", choices=("embedded", "nullbulk"), default="embedded")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the decode figures")
    p.add_argument("--amqp", default=RABBITMQ)
    p.add_argument("--dir", type=Path, default=None, help="where the embedded indexes go")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--writer-docs", type=int, default=50_000, help="writer figures; 0: none")
    p.add_argument("--writer-osmem", type=int, default=0, help="writer figures on osmem too")
    p.add_argument("--preloaded", action="store_true", help="the index holds them already")
    p.add_argument("--changed", type=float, default=0.1, help="with --preloaded: share changed")
    args = p.parse_args()
    if args.preloaded and args.engine != "embedded":
        p.error("--preloaded needs an index that keeps documents: --engine embedded")
    corpus = Corpus(args.seed)
    audit = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    out: dict[str, Any] = {
        "benchmark": "audit_burst",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {
            "count": args.count,
            "engine": args.engine,
            "workers": args.workers,
            "preloaded": args.preloaded,
            "changed": args.changed if args.preloaded else None,
        },
    }
    say("decode figures")
    out["decode"] = decode_figures(corpus, audit, args.rounds)
    if args.writer_docs:
        say("writer figures")
        out["writer"] = writer_figures(
            corpus, audit, args.writer_docs, max(1, args.rounds // 2), args.writer_osmem
        )
    site: EngineSite = (
        EmbeddedSite(args.dir or Path(tempfile.gettempdir()))
        if args.engine == "embedded"
        else NullBulkSite()
    )
    out["engine"] = site.describe()
    bursts: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []  # issue 11's goal: a million in under two minutes
    try:
        for n in (int(w) for w in args.workers.split(",") if w):
            say(f"building {args.count:,} instance.exists for --workers {n}")
            stamp, first = time.time(), n * 10_000_000
            every = round(1 / args.changed) if args.preloaded and args.changed else 0
            bodies = [
                corpus.exists(first + i, stamp, audit, changed=bool(every) and i % every == 0)
                for i in range(args.count)
            ]
            prepare = preloader(corpus, first, args.count, audit) if args.preloaded else None
            burst = run_workers(args, site, bodies, ConsumerConfig(), n, prepare)
            del bodies
            rate = burst["notifications_per_s"]
            burst["seconds_per_million"] = round(1_000_000 / rate, 1)
            checks.append(
                {
                    "engine": f"{args.engine}, --workers {n}",
                    **target(
                        "seconds_per_million",
                        1_000_000 / rate,  # the verdict on the figure, not its rounding
                        TARGET_SECONDS_PER_MILLION,
                        "<=",
                    ),
                }
            )
            bursts[f"workers_{n}"] = burst
    finally:
        site.close()
    out["burst"] = bursts
    out["targets"] = checks
    out.update(summary(checks))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
