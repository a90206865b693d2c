"""Lag at a steady rate: a child process publishes at ``--lag-rate`` for
``--lag-seconds`` while the indexer runs; lag = when ``engine.bulk`` returned for a
document minus its notification's timestamp, per message (the indexer's
``LAG_SECONDS`` histogram is reported beside it as a cross-check).

With ``--lag-pipeline process`` (the CLI's default) the engine is in the writer
process, which measures the same difference there and sends it back with each verdict
(``Outcome.lag``); those are the per-message lags then."""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
from typing import Any

from kombu import Connection

from bench.bus import Topology, steady_publisher
from bench.indexer_run import run_indexer
from bench.measure import Instrumented, quantile, say
from bench.sites import EngineSite
from cellsight.indexer import metrics, write_process
from cellsight.indexer.consumer import ConsumerConfig, IndexerConsumer
from cellsight.indexer.outcomes import Outcome, Verdict


def _lag_histogram() -> dict[float, float]:
    """Cumulative bucket counts of the indexer's LAG_SECONDS histogram, by upper bound."""
    counts: dict[float, float] = {}
    for family in metrics.REGISTRY.collect():
        if family.name == "cellsight_indexer_lag_seconds":
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    counts[float(s.labels["le"])] = s.value
    return counts


def _bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0
    for le, cum in delta:
        if total and cum >= q * total:
            return le
    return math.nan


def phase_lag(
    args: argparse.Namespace, site: EngineSite, corpus_seed: int, config: ConsumerConfig
) -> dict[str, Any]:
    topo = Topology.fresh("lag")
    engine = site.fresh("lag")
    clock = Instrumented(engine)
    total = int(args.lag_rate * args.lag_seconds)
    try:
        with Connection(args.amqp) as conn:
            topo.declare(conn)
        before = _lag_histogram()
        ctx = mp.get_context("spawn")
        receive, send = ctx.Pipe()
        child = ctx.Process(
            target=steady_publisher,
            args=(
                args.amqp,
                topo.exchange,
                corpus_seed,
                10_000_000,
                args.lag_rate,
                args.lag_seconds,
                send,
            ),
            daemon=True,
        )
        report: dict[str, Any] = {}
        go = [False]

        def until(consumer: IndexerConsumer) -> bool:
            if not go[0] and consumer._consuming_since is not None:  # the consumer is up
                receive.send("go")
                go[0] = True
            if go[0] and not report and receive.poll():
                report.update(receive.recv())
            return bool(report) and consumer.acked >= total

        child.start()
        if not receive.poll(300) or receive.recv() != "ready":
            raise RuntimeError("the lag publisher did not start")
        say(f"  {site.name} lag: publishing {args.lag_rate:,.0f}/s for {args.lag_seconds}s")
        process = args.lag_pipeline == "process"
        seen: list[float] = []
        record = write_process.record_outcomes

        def recording(outcomes: list[Outcome]) -> None:
            seen.extend(o.lag for o in outcomes if o.verdict is Verdict.INDEXED and o.lag)
            record(outcomes)

        write_process.record_outcomes = recording  # type: ignore[assignment]
        try:
            _, seconds, cpu, _ = run_indexer(
                args.amqp,
                clock,
                topo.config(config),
                until,
                timeout=args.lag_seconds + 600,
                write_process=write_process.reopened(engine) if process else None,
            )
        finally:
            write_process.record_outcomes = record
        child.join(30)
        after = _lag_histogram()
        if process:
            lags = seen
            missing = len(report["stamps"]) - len(lags)
        else:
            lags = [clock.done[u] - ts for u, ts in report["stamps"] if u in clock.done]
            missing = sum(1 for u, _ in report["stamps"] if u not in clock.done)
        p50, p99 = quantile(lags, 0.50), quantile(lags, 0.99)
        say(f"  {site.name} lag: p50 {p50:.3f}s p99 {p99:.3f}s max {max(lags):.3f}s")
        return {
            "pipeline": args.lag_pipeline,
            "published": len(report["stamps"]),
            "publish_rate_achieved": round(report["rate"], 1),
            "publish_seconds": round(report["seconds"], 2),
            "indexed": len(lags),
            "missing": missing,
            "lag_p50_s": round(p50, 4),
            "lag_p90_s": round(quantile(lags, 0.90), 4),
            "lag_p99_s": round(p99, 4),
            "lag_max_s": round(max(lags), 4),
            "lag_mean_s": round(statistics.fmean(lags), 4),
            "histogram_p50_le_s": _bucket_quantile(before, after, 0.50),
            "histogram_p99_le_s": _bucket_quantile(before, after, 0.99),
            # Both clocks start as the consumer consumes (``run_indexer``).
            "drain_seconds_after_publish": round(max(0.0, seconds - report["seconds"]), 2),
            "indexer_cpu_share": round(cpu / seconds, 3),
        }
    finally:
        site.release(engine)
        topo.delete(args.amqp)
