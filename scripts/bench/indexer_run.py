"""One timed drain by ``IndexerConsumer`` on a thread of this process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kombu import Connection

from bench.measure import MACHINE, Stages, cpu_seconds
from cellsight.indexer.consumer import ConsumerConfig, IndexerConsumer
from cellsight.indexer.inflight import Pipeline
from cellsight.indexer.write_process import WriterFactory


def run_indexer(
    url: str,
    engine: Any,
    config: ConsumerConfig,
    until: Callable[[IndexerConsumer], bool],
    timeout: float,
    stages: Stages | None = None,
    profile: Path | None = None,
    write_process: WriterFactory | None = None,
    pipeline: Pipeline | None = None,
) -> tuple[IndexerConsumer, float, float, float]:
    """Run an IndexerConsumer on a thread until ``until(consumer)``; returns it, the
    seconds from its basic.consume to that moment, the CPU seconds of this process (the bus
    thread and the writer threads) and of its writer process meanwhile, and of the
    writer process alone (0 without one). ``pipeline`` stands in for its writes
    (``IndexerConsumer``)."""
    conn = Connection(url)
    # As ``cellsight indexer`` runs it: the cycle collector between batches.
    consumer = IndexerConsumer(
        conn,
        engine,
        config,
        write_process=write_process,
        collect_between_batches=True,
        pipeline=pipeline,
    )
    child = getattr(consumer._flights, "pid", None)  # the writer process, if any
    if stages is not None:
        stages.on_consumer(consumer)
    prof: Any = None

    def target() -> None:
        nonlocal prof
        if profile is not None:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        try:
            consumer.run()
        finally:
            if prof is not None:
                prof.disable()

    thread = threading.Thread(target=target, name="indexer", daemon=True)
    with MACHINE.section():  # the broker's and the machine's CPU meanwhile: MACHINE.last
        started = time.monotonic()
        proc0, child0 = time.process_time(), cpu_seconds(child)
        thread.start()
        deadline = time.monotonic() + timeout
        consuming: float | None = None
        while not until(consumer):
            if consuming is None and consumer._consuming_since is not None:
                # The clocks start when it consumes, as the plain consumer's do at its
                # basic.consume: connecting and declaring are no part of a drain.
                consuming = consumer._consuming_since
                proc0, child0 = time.process_time(), cpu_seconds(child)
            if not thread.is_alive():
                raise RuntimeError("the indexer thread died")
            if time.monotonic() > deadline:
                consumer.stop.set()
                raise RuntimeError(f"indexer timed out after {timeout}s at {consumer.acked} acked")
            time.sleep(0.005)
        elapsed = time.monotonic() - (consuming or started)
        if consuming is not None and consumer._consuming_since != consuming:
            consumer.stop.set()
            raise RuntimeError(
                "the indexer reconnected during the drain: its time is not one drain"
            )
        child1 = cpu_seconds(child)  # one reading: the two figures split the same total
        writer_cpu = child1 - child0
        cpu = time.process_time() - proc0 + writer_cpu
    consumer.stop.set()
    thread.join(60)
    conn.release()
    if prof is not None and profile is not None:
        prof.dump_stats(str(profile))
    return consumer, elapsed, cpu, writer_cpu


def drain(
    url: str, engine: Any, config: ConsumerConfig, count: int, **kwargs: Any
) -> tuple[IndexerConsumer, float, float, float]:
    """``run_indexer`` until exactly ``count`` messages are acked (more is an error)."""
    out = run_indexer(
        url, engine, config, lambda c: c.acked >= count, max(600.0, count / 100), **kwargs
    )
    if out[0].acked != count:
        raise RuntimeError(f"the consumer acked {out[0].acked} of {count}")
    return out
