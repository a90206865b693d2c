"""``cellsight indexer --workers N`` as an operator runs it: the real command in its own
process(es), draining a prepublished queue into the engine, for N = 1 and N = 2.

The rate is counted from the moment all N consumers are attached to the queue (the
documents already written by then are subtracted) to the moment the index holds every
document; over an index prepared beforehand (``prepare``), whose count does not move for
a notification found stale, to the moment the workers' metrics count every verdict. The
resident memory of every indexer process is sampled meanwhile, and its CPU time read
from /proc at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from bench.bus import Topology, prepublish
from bench.measure import RssSampler, cpu_seconds, descendants, free_port, listening, say
from bench.sites import EngineSite
from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.engines.base import SearchEngine


def _consumers(url: str, topo: Topology) -> int:
    with Connection(url) as conn, conn.channel() as ch:
        return int(ch.queue_declare(topo.queue, passive=True).consumer_count)


def _count(engine: SearchEngine) -> int:
    try:
        engine.refresh("instance")
        return engine.count("instance")
    except Exception:  # not created yet by the starting command
        return 0


def _paced(read: Callable[[], int]) -> tuple[int, float]:
    """A progress reading and how long to wait before the next: 50 ms, or 20 times what
    the reading took. A count scans the index and a scrape of the workers' ``/metrics``
    renders every family in the worker's own process, so at a fixed 50 ms the bench
    took more and more of the CPU of the run it measures."""
    started = time.perf_counter()
    done = read()
    return done, max(0.05, 20 * (time.perf_counter() - started))


VERDICT_METRICS = {
    "cellsight_indexer_consumed": "consumed",
    "cellsight_indexer_indexed": "indexed",
    "cellsight_indexer_stale": "stale",
    "cellsight_indexer_ignored": "ignored",
    "cellsight_indexer_dead_lettered": "dead",
}


def _free_ports(n: int) -> int:
    """A port ``p`` with ``p`` .. ``p + n - 1`` free: worker ``i`` serves its metrics
    on ``metrics_port + i``."""
    for _ in range(100):
        base = free_port()
        if base + n < 65536 and not any(listening(base + i) for i in range(1, n)):
            return base
    raise RuntimeError(f"no {n} free consecutive ports for the workers' metrics")


def verdicts(base: int, n: int) -> Counter[str]:
    """The N workers' verdict counters, from their ``/metrics`` (a worker not serving
    yet counts nothing)."""
    totals: Counter[str] = Counter()
    for i in range(n):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{base + i}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            name = VERDICT_METRICS.get(family.name)
            if name is not None:
                total = sum(s.value for s in family.samples if s.name.endswith("_total"))
                totals[name] += int(total)
    return totals


def _quarter_rates(progress: list[tuple[float, int]], total: int) -> list[float]:
    """Documents/s over each quarter of the documents (from the progress readings)."""
    rates = []
    for q in range(4):
        lo, hi = total * q / 4, total * (q + 1) / 4
        start = next((p for p in progress if p[1] >= lo), None)
        end = next((p for p in progress if p[1] >= hi), None)
        if start is None or end is None or end[0] <= start[0]:
            continue
        rates.append(round((end[1] - start[1]) / (end[0] - start[0]), 1))
    return rates


def run_workers(
    args: argparse.Namespace,
    site: EngineSite,
    bodies: Sequence[bytes],
    config: ConsumerConfig,
    n: int,
    prepare: Callable[[SearchEngine], None] | None = None,
) -> dict[str, Any]:
    """``prepare`` fills the command's index before it starts (untimed)."""
    topo = Topology.fresh(f"workers{n}")
    tag = f"workers{n}-{topo.queue[-8:]}"
    data_dir = Path(tempfile.mkdtemp(prefix=f"cellsight-bench-{tag}-"))
    env = dict(os.environ)
    env.update(
        {
            "CELLSIGHT_BUS_URL": args.amqp,
            "CELLSIGHT_EXCHANGE": topo.exchange,
            "CELLSIGHT_INDEXER_QUEUE": topo.queue,
            "CELLSIGHT_DEAD_LETTER_EXCHANGE": topo.dlx,
            "CELLSIGHT_DEAD_LETTER_QUEUE": topo.dlq,
            "CELLSIGHT_BATCH_COUNT": str(config.batch_count),
            "CELLSIGHT_BATCH_BYTES": str(config.batch_bytes),
            "CELLSIGHT_BATCH_AGE_MS": str(int(config.batch_age * 1000)),
            "CELLSIGHT_PREFETCH": str(config.prefetch),
            "CELLSIGHT_METRICS_PORT": str(metrics_port := _free_ports(n)),
            **site.cli_env(tag, data_dir),
        }
    )
    if prepare is not None:
        prepared = site.cli_engine(tag, data_dir)
        try:
            prepare(prepared)
        finally:
            prepared.close()
    prepublish(args.amqp, topo, bodies)
    command = [sys.executable, "-m", "cellsight", "--data-dir", str(data_dir), "indexer"]
    proc = subprocess.Popen(
        [*command, "--workers", str(n)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Every process of the command: the consumer (or the supervisor's N of them) and
    # each consumer's writer process.
    indexers = (
        (lambda: [proc.pid, *descendants(proc.pid)]) if n == 1 else (lambda: descendants(proc.pid))
    )
    sampler = RssSampler(indexers)
    sampler.start()
    engine = site.cli_engine(tag, data_dir)
    try:
        deadline = time.monotonic() + 120
        while _consumers(args.amqp, topo) < n:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"--workers {n} did not start: {proc.stderr.read()}")  # type: ignore[union-attr]
            time.sleep(0.02)
        progressed: Callable[[], tuple[int, float]] = (
            (lambda: _paced(lambda: _count(engine)))
            if prepare is None
            else (lambda: _paced(lambda: verdicts(metrics_port, n)["consumed"]))
        )
        started, before = time.perf_counter(), progressed()[0]
        sampler.mark()
        pids = indexers()
        cpu0 = sum(cpu_seconds(p) for p in pids)
        deadline = time.monotonic() + max(600.0, len(bodies) / 50)
        progress = [(0.0, before)]
        while (reading := progressed())[0] < len(bodies):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"--workers {n} stopped at {reading[0]} documents")
            progress.append((time.perf_counter() - started, reading[0]))
            time.sleep(reading[1])
        seconds = time.perf_counter() - started
        progress.append((seconds, len(bodies)))
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        totals = verdicts(metrics_port, n)
        documents = _count(engine)
    finally:
        sampler.halt.set()
        proc.send_signal(signal.SIGTERM)
        code: int | None
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        engine.close()
        topo.delete(args.amqp)
        shutil.rmtree(data_dir, ignore_errors=True)  # a million documents: gigabytes
    counted = len(bodies) - before
    rate = counted / seconds
    say(f"  {site.name} --workers {n}: {rate:,.0f}/s, exit {code}")
    return {
        "workers": n,
        "notifications_timed": counted,
        "already_written_when_all_attached": before,
        "seconds": round(seconds, 3),
        "notifications_per_s": round(rate, 1),
        "verdicts": dict(totals),
        "documents_after": documents,
        "per_s_by_quarter": _quarter_rates(progress, len(bodies)),
        "cpu_us_per_notification_all_processes": round(cpu / counted * 1e6, 1),
        "exit_code": code,
        "rss": sampler.summary(),
    }


def phase_workers(
    args: argparse.Namespace,
    site: EngineSite,
    make_bodies: Any,
    config: ConsumerConfig,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (1, 2):
        bodies = make_bodies(n)
        out[f"workers_{n}"] = run_workers(args, site, bodies, config, n)
        del bodies
    one, two = out["workers_1"], out["workers_2"]
    out["ratio_2_to_1"] = round(two["notifications_per_s"] / one["notifications_per_s"], 2)
    return out
