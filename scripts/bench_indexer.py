"""Indexer benchmark: notifications through RabbitMQ into each engine, with baselines.

    .venv/bin/python scripts/bench_indexer.py [--count 20000] [--engines embedded,nullbulk]
        [--lag-rate 2000] [--lag-seconds 60] [--one-by-one-count 2000] [--drains 2]
        > result.json

JSON on stdout, progress on stderr. Per engine, in one run (``scripts/bench/``):

* **indexer_write_process** (the CLI's default, whose figures are the headline) and
  **indexer** (writer threads in one process): ``--count`` real-size notifications
  (Nova's instance-create-end, instance-update and instance-power_off-end samples in
  turn, one instance uuid each, oslo-wrapped, persistent, 2.5-3 KB on the wire) are
  published with publisher confirms (not timed), then ``IndexerConsumer`` with the
  production settings drains them: notifications/s from its start to the last ack, and
  CPU microseconds per notification (both processes; per stage for writer threads).
* **plain consumer** (the bus's own pace): a kombu consumer that only receives and acks
  (``multiple`` every 500) the same notifications from a queue of its own.
* **ceiling**: the same documents mapped before the clock starts, then only
  ``engine.bulk`` in batches of the consumer's size, into an engine of its own.
* **floor** (the embedded engine): the same documents' rows, also built before the
  clock, through the same SQL with nothing else (``bench/floor.py``): the ceiling
  target's limit.
* **bus + floor** (the embedded engine): the indexer's own consumer, batches and acks,
  with a writer process that writes the same rows, built before the clock, through the
  floor's SQL, and nothing decoded (``bench/bus_floor.py``): the ratio targets' limit.
* **one by one** (how the previous generation worked): decode, write one document, ack.
* These five (seven with the floor and the bus + floor) are interleaved in ``--rounds``
  rounds (rotated order) so that on a busy machine they see the same load; ratios come
  from the totals.
* Every target is reported with its value, threshold and ``status``
  (``bench/targets.py``): ``met``, ``beyond_limit`` or ``missed``.
* **whole drains**: the indexer (writer process), the plain consumer and the bus +
  floor consumer each drain all ``--count`` in one go, ``--drains`` times alternating
  (``bench/drains.py``): the same ratio over 20 batches instead of the rounds' four.
* **lag**: a separate process publishes at ``--lag-rate`` for ``--lag-seconds`` while
  the indexer runs (``--lag-pipeline``); lag = when ``engine.bulk`` returned for a
  document minus its notification's timestamp.
* **workers**: the real ``cellsight indexer --workers 1`` then ``--workers 2`` drain
  ``--workers-count`` notifications; their processes' RSS is sampled meanwhile.

Engines: ``embedded`` (SQLite), ``nullbulk`` (``OpenSearchEngine`` against a loopback
endpoint that answers success per item: the indexer's own ceiling on the HTTP path),
``osmem`` (an in-memory OpenSearch peer; slow). Queues, exchanges, index files and
indexes are deleted afterwards.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bus import RABBITMQ
from bench.corpus import KINDS, Corpus
from bench.drains import whole_drains
from bench.lag import phase_lag
from bench.limits import bus_floor_limit, machine_limit
from bench.measure import say
from bench.phases import throughput
from bench.sites import EmbeddedSite, EngineSite, NullBulkSite, OsmemSite
from bench.targets import summary, target
from bench.workers import phase_workers

from cellsight.indexer.consumer import ConsumerConfig

TARGET_EMBEDDED_PER_S = 6_500
TARGET_CEILING_DOCS_PER_S = 25_000
TARGET_NULLBULK_PER_S = 15_000
TARGET_RATIO_TO_PLAIN = 0.6
TARGET_RATIO_TO_ONE_BY_ONE = 15.0
TARGET_LAG_P99_S = 1.0
TARGET_RSS_MB = 200.0
# Decode + map in the running indexer, where the issue measured its 255 µs (decode 170,
# map 85): bench_decode.py measures the same code alone, on warm, repeated bodies.
TARGET_DECODE_MAP_US = 25.0


# Main ---------------------------------------------------------------------------------
def guarded(phase: str, run: Callable[[], dict[str, Any]], failures: list[str]) -> Any:
    """A phase that fails is reported (in ``problems``) instead of losing the run."""
    try:
        return run()
    except Exception as exc:
        say(f"  {phase} failed: {exc}")
        failures.append(f"{phase} failed: {type(exc).__name__}: {str(exc)[:500]}")
        return None


def bench_engine(
    args: argparse.Namespace, site: EngineSite, corpus: Corpus, count: int
) -> dict[str, Any]:
    config = ConsumerConfig(
        batch_count=args.batch_count,
        batch_bytes=args.batch_bytes,
        batch_age=args.batch_age,
        prefetch=args.prefetch,
    )
    failures: list[str] = []
    ones = 0 if site.name == "nullbulk" else args.one_by_one_count
    say(f"{site.name}: building {count:,} + {ones:,} notifications")
    ts0 = time.time() - 3600
    bodies = [corpus.body(i, ts0 + i / 1000) for i in range(count)]
    one_bodies = [corpus.body(5_000_000 + i, ts0) for i in range(ones)]
    tp = throughput(args, site, bodies, one_bodies, config)
    drains = None
    if args.drains > 0:
        prefetch, drained = tp["indexer"]["prefetch"], bodies
        drains = guarded(
            "whole drains", lambda: whole_drains(args, site, drained, config, prefetch), failures
        )
        del drained
    del bodies, one_bodies
    gc.collect()
    lag = None
    if args.lag_seconds > 0 and site.name != "nullbulk":
        lag = guarded("lag", lambda: phase_lag(args, site, corpus.seed, config), failures)
    workers = None
    if site.name in args.workers_engines.split(","):

        def make(n: int) -> list[bytes]:
            base = 20_000_000 + n * 1_000_000
            return [corpus.body(base + i, ts0) for i in range(args.workers_count)]

        workers = guarded("workers", lambda: phase_workers(args, site, make, config), failures)

    ind, ceil, one, plain = tp["indexer"], tp["ceiling"], tp["one_by_one"], tp["plain_consumer"]
    wp = tp["indexer_write_process"]
    # The one-process figures are those of the CLI's default pipeline (a writer process);
    # writer threads (``indexer``) are the same run's comparison.
    threads_rate = ind["notifications_per_s"]
    rate = wp["notifications_per_s"]
    one_rate = one.get("notifications_per_s")
    result: dict[str, Any] = {
        "count": count,
        "pipeline": "writer process (cellsight.indexer.write_process)",
        "notifications_per_s": rate,
        "writer_threads_per_s": threads_rate,
        "write_process_to_threads": round(rate / threads_rate, 2),
        "cpu_us_per_notification_write_process": wp["cpu_us_per_notification"],
        "plain_consumer_per_s": plain["messages_per_s"],
        "ratio_to_plain_consumer": round(rate / plain["messages_per_s"], 3),
        "ratio_to_plain_consumer_whole_drains": (
            drains["ratio_to_plain_consumer"] if drains else None
        ),
        "ceiling_docs_per_s": ceil["docs_per_s"],
        "floor_docs_per_s": tp["floor"].get("docs_per_s"),
        "bus_floor_per_s": tp["bus_floor"].get("notifications_per_s"),
        "ratio_to_ceiling": round(rate / ceil["docs_per_s"], 3),
        "one_by_one_per_s": one_rate,
        "ratio_to_one_by_one": round(rate / one_rate, 1) if one_rate else None,
        "lag_p50_s": lag["lag_p50_s"] if lag else None,
        "lag_p99_s": lag["lag_p99_s"] if lag else None,
        # CPU of this process while the indexer ran (its bus thread and writer threads):
        # steadier than wall time on a busy machine. An HTTP engine's own work happens
        # in the server, outside it.
        "cpu_us_per_notification_threads": ind["cpu_us_per_notification"],
        "cpu_us_per_notification_by_stage_threads": ind["cpu_us_per_notification_by_stage"],
        "machine_limit": machine_limit(wp, plain),
        "workers_2_to_1": workers["ratio_2_to_1"] if workers else None,
        "indexer_rss_max_mb": workers["workers_1"]["rss"]["max_mb"] if workers else None,
        **tp,
        "whole_drains": drains,
        "lag": lag,
        "workers": workers,
        "engine": site.describe(),
    }
    checks = []
    bus = plain["messages_per_s"]
    if site.name == "embedded":
        checks.append(target("notifications_per_s", rate, TARGET_EMBEDDED_PER_S))
        floor = tp["floor"].get("docs_per_s")
        checks.append(
            target(
                "ceiling_docs_per_s",
                ceil["docs_per_s"],
                TARGET_CEILING_DOCS_PER_S,
                # The same rows through the same SQL with nothing else, in the same rounds.
                limit=(floor, "sqlite floor (same rows, same SQL)") if floor else None,
            )
        )
    if site.name == "nullbulk":
        # Neither the bus nor the endpoint can be outrun, whatever the indexer does.
        slower = min((bus, "plain consumer"), (ceil["docs_per_s"], "null endpoint ceiling"))
        checks.append(target("notifications_per_s", rate, TARGET_NULLBULK_PER_S, limit=slower))
    checks.append(
        target(
            "ratio_to_plain_consumer",
            result["ratio_to_plain_consumer"],
            TARGET_RATIO_TO_PLAIN,
            limit=bus_floor_limit(tp["bus_floor"], plain),
        )
    )
    stages = ind["cpu_us_per_notification_by_stage"]  # Stages.breakdown: every stage, always
    in_pipeline = round(stages["decode"] + stages["map"], 1)
    checks.append(target("decode_map_us_in_pipeline", in_pipeline, TARGET_DECODE_MAP_US, "<="))
    if drains:
        # The same target over drains of the whole --count (bench/drains.py says why both).
        checks.append(
            target(
                "ratio_to_plain_consumer_whole_drains",
                drains["ratio_to_plain_consumer"],
                TARGET_RATIO_TO_PLAIN,
                limit=bus_floor_limit(drains["bus_floor"], drains["plain_consumer"]),
            )
        )
    if one:
        checks.append(
            target(
                "ratio_to_one_by_one",
                result["ratio_to_one_by_one"],
                TARGET_RATIO_TO_ONE_BY_ONE,
                # A consumer draining at the bus's own pace would score this.
                limit=(round(bus / one_rate, 1), "plain consumer / one by one"),
            )
        )
    if lag:
        checks.append(target("lag_p99_s", lag["lag_p99_s"], TARGET_LAG_P99_S, "<="))
    if workers and workers["workers_1"]["rss"]["max_mb"] is not None:
        checks.append(
            target("indexer_rss_max_mb", workers["workers_1"]["rss"]["max_mb"], TARGET_RSS_MB, "<=")
        )
    result["targets"] = checks
    problems = list(failures)
    if ind["documents_after"] != ind["documents_expected"]:
        problems.append(f"indexer engine holds {ind['documents_after']} documents")
    if drains and any(n != count for n in drains["indexer_write_process"]["documents_after_each"]):
        problems.append("a whole drain's engine does not hold every document")
    if wp["documents_after"] != wp["documents_expected"] or wp["dead_lettered"]:
        problems.append(f"write-process engine holds {wp['documents_after']} documents")
    if ind["dead_lettered"] or ind["queues_left"] or one.get("failed_writes"):
        problems.append("dead letters, leftover messages or failed one-by-one writes")
    if ceil["documents_after"] != count or ceil["taken"] != count:
        problems.append(f"ceiling engine holds {ceil['documents_after']} documents")
    if tp["floor"] and tp["floor"]["documents_after"] != count:
        problems.append(f"the floor's index holds {tp['floor']['documents_after']} documents")
    if tp["bus_floor"] and tp["bus_floor"]["documents_after"] != count:
        problems.append(f"the bus + floor index holds {tp['bus_floor']['documents_after']} rows")
    if drains and any(n != count for n in drains["bus_floor"].get("documents_after_each", [])):
        problems.append("a whole drain's bus + floor index does not hold every row")
    if lag and (lag["missing"] or lag["indexed"] != lag["published"]):
        problems.append(f"lag: {lag['missing']} published notifications never written")
    if workers and any(workers[f"workers_{n}"]["exit_code"] != 0 for n in (1, 2)):
        problems.append("a --workers run did not exit 0 on SIGTERM")
    result["problems"] = problems
    return result


def notes(out: dict[str, Any]) -> list[str]:
    found = []
    cpus = out["host"]["cpus"] or 1
    load = max(out["host"]["loadavg_start"][0], out["host"]["loadavg_end"][0])
    if load > cpus * 0.75:
        found.append(
            f"busy machine: load average up to {load:.1f} on {cpus} CPUs during the run; "
            "wall-clock rates are depressed and vary between phases, CPU-time figures "
            "(cpu_us_*) are steadier"
        )
    osmem = out["engines"].get("osmem")
    if osmem:
        if osmem["count"] != out["config"]["count"]:
            found.append(f"osmem ran {osmem['count']:,} notifications (--osmem-count)")
        if osmem["lag"] and osmem["ceiling_docs_per_s"] < out["config"]["lag_rate"]:
            found.append(
                f"osmem's own bulk ceiling here ({osmem['ceiling_docs_per_s']:,.0f} docs/s) is "
                f"below the {out['config']['lag_rate']:,.0f}/s lag rate: its backlog, so its "
                "lag, grows for the whole publishing window"
            )
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--count", type=int, default=20_000, help="notifications per engine")
    p.add_argument("--osmem-count", type=int, default=None, help="override --count for osmem")
    p.add_argument("--engines", default="embedded,nullbulk", help="embedded, nullbulk, osmem")
    p.add_argument("--lag-rate", type=float, default=2000.0)
    p.add_argument("--lag-seconds", type=float, default=60.0)
    p.add_argument(
        "--lag-pipeline",
        choices=["process", "threads"],
        default="process",
        help="the indexer's pipeline in the lag phase (the CLI's default: process)",
    )
    p.add_argument("--one-by-one-count", type=int, default=2000)
    p.add_argument(
        "--drains",
        type=int,
        default=2,
        help="whole drains of --count by the indexer and the plain consumer (0: none)",
    )
    p.add_argument("--workers-engines", default="embedded,nullbulk", help="'' to skip")
    p.add_argument("--workers-count", type=int, default=None, help="default: --count")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleave the phases (ceiling, floor, indexers, one-by-one, plain) in N rounds",
    )
    defaults = ConsumerConfig()
    p.add_argument("--batch-count", type=int, default=defaults.batch_count)
    p.add_argument("--batch-bytes", type=int, default=defaults.batch_bytes)
    p.add_argument("--batch-age", type=float, default=defaults.batch_age)
    p.add_argument("--prefetch", type=int, default=defaults.prefetch)
    p.add_argument("--amqp", default=RABBITMQ)
    p.add_argument("--dir", type=Path, default=None, help="where the embedded indexes go")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile-dir", default=None, help="cProfile the indexer thread into here")
    args = p.parse_args()
    if args.profile_dir:
        Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    args.one_by_one_count = min(args.one_by_one_count, args.count)
    args.workers_count = args.workers_count or args.count

    corpus = Corpus(args.seed)
    sizes = [len(corpus.body(i, time.time())) for i in range(300)]
    out: dict[str, Any] = {
        "benchmark": "indexer",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        },
        "config": {
            "count": args.count,
            "osmem_count": args.osmem_count or args.count,
            "engines": args.engines,
            "lag_rate": args.lag_rate,
            "lag_seconds": args.lag_seconds,
            "lag_pipeline": args.lag_pipeline,
            "one_by_one_count": args.one_by_one_count,
            "workers_engines": args.workers_engines,
            "workers_count": args.workers_count,
            "rounds": args.rounds,
            "consumer": {
                "batch_count": args.batch_count,
                "batch_bytes": args.batch_bytes,
                "batch_age": args.batch_age,
                "prefetch": args.prefetch,
            },
            "notifications": {
                "kinds": list(KINDS),
                "mix": "round robin, one instance uuid per notification",
                "wire_bytes_mean": round(statistics.fmean(sizes)),
                "wire_bytes_min": min(sizes),
                "wire_bytes_max": max(sizes),
                "wrapped": "oslo.messaging 2.0, persistent, publisher confirms (not timed)",
            },
        },
        "engines": {},
    }
    sites: dict[str, Callable[[], EngineSite]] = {
        "embedded": lambda: EmbeddedSite(args.dir or Path(tempfile.gettempdir())),
        "osmem": OsmemSite,
        "nullbulk": NullBulkSite,
    }
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if name not in sites:
            p.error(f"unknown engine {name!r} (embedded, nullbulk, osmem)")
        site = sites[name]()
        count = args.osmem_count if name == "osmem" and args.osmem_count else args.count
        try:
            out["engines"][name] = bench_engine(args, site, corpus, count)
        except Exception as exc:
            say(f"{name} failed: {exc}")
            out["engines"][name] = {"targets": [], "problems": [f"{type(exc).__name__}: {exc}"]}
        finally:
            site.close()
        gc.collect()
    out["host"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["targets"] = [
        {"engine": name, **t} for name, r in out["engines"].items() for t in r["targets"]
    ]
    out.update(summary(out["targets"]))
    out["notes"] = notes(out)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
