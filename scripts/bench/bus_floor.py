"""The limit of the ratio to the plain consumer: the bus and SQLite alone, in the
indexer's own shape.

``IndexerConsumer`` receives and acks as the CLI's indexer does (its own receive path,
batch settings, prefetch and ``multiple`` acks), but its pipeline is ``FloorPipeline``:
no batch is decoded or mapped, and a child process writes, for each batch, the same
number of rows prepared before the clock from the same notifications, through the
floor's SQL (``bench/floor.py``: the engine's own statements with nothing else, one
transaction a batch). Only a count crosses the pipe. That is what an indexer on the
embedded engine could reach on this machine if decoding, mapping, the engine's Python
and the pipe's documents cost nothing: no indexer does less and still writes the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing as mp
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bus import Topology, prepublish
from bench.indexer_run import drain
from bench.measure import MACHINE, Tally
from cellsight.indexer.amqp_deliveries import Received
from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.outcomes import Outcome, Verdict
from cellsight.indexer.write_process import PumpThrottle

INDEXED = Outcome(Verdict.INDEXED)
STARTUP_TIMEOUT = 60.0


def _child(conn: Any, path: str) -> None:
    """Prepares rows from the bodies it is sent (untimed), then writes the next ``n`` of
    them for each batch, in the order they were sent, as the queue delivers them."""
    from bench.floor import FloorWriter
    from cellsight.indexer.writer import plan

    floor = FloorWriter(Path(path))
    pending: deque[Any] = deque()
    conn.send(("ready",))
    try:
        while True:
            kind, *rest = conn.recv()
            if kind == "load":
                (bodies,) = rest
                _, planned = plan(bodies)
                if len(planned) != len(bodies):
                    raise RuntimeError(f"{len(planned)} writes planned for {len(bodies)} bodies")
                pending.extend(floor.prepare([p.op for p in planned]))
                del planned, bodies
                gc.collect()
                conn.send(("loaded", len(pending)))
            elif kind == "write":
                seq, n = rest
                floor.write([pending.popleft() for _ in range(n)])
                conn.send(("done", seq))
            elif kind == "count":
                conn.send(("count", floor.engine.count("instance")))
            else:
                break
    except Exception as exc:  # told to the parent, which stops the benchmark
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        floor.close()


@dataclass
class FloorBatch:
    messages: list[Received]
    seq: int = 0
    started: float = 0.0


class FloorPipeline:
    """``inflight.Pipeline`` with a floor writer process: one batch being written, one
    waiting in the pipe, as the CLI's pipeline holds them on the embedded engine."""

    def __init__(self, path: Path) -> None:
        self.path = path
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child_conn, str(path)), daemon=True)
        self._proc.start()
        child_conn.close()
        self.limit = 2
        self._queue: deque[FloorBatch] = deque()
        self._done: set[int] = set()
        self._seq = 0
        self._throttle = PumpThrottle()  # as the CLI's pipeline looks at its pipe
        if not self._conn.poll(STARTUP_TIMEOUT) or self._conn.recv() != ("ready",):
            self.shutdown()
            raise RuntimeError("the floor's writer process did not start")

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def load(self, bodies: Sequence[bytes]) -> None:
        """The rows of these bodies, prepared in the child before the clock starts."""
        self._conn.send(("load", list(bodies)))
        self._answer("loaded")

    def _answer(self, expected: str) -> Any:
        kind, value = self._conn.recv()
        if kind != expected:
            raise RuntimeError(f"the floor's writer process {kind}: {value}")
        return value

    def documents(self) -> int:
        self._conn.send(("count",))
        return int(self._answer("count"))

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def messages(self) -> int:
        return sum(len(b.messages) for b in self._queue)

    def prepare(self, messages: list[Received]) -> FloorBatch:
        return FloorBatch(messages)

    def can_take(self, batch: FloorBatch) -> bool:
        return len(self._queue) < self.limit

    def launch(self, batch: FloorBatch) -> None:
        self._seq += 1
        batch.seq, batch.started = self._seq, time.perf_counter()
        self._conn.send(("write", batch.seq, len(batch.messages)))
        self._queue.append(batch)

    def _pump(self, timeout: float = 0.0) -> None:
        while self._conn.poll(timeout):
            timeout = 0.0
            self._done.add(self._answer("done"))

    def any_settled(self) -> bool:
        if not self._queue:
            return False
        if self._queue[0].seq not in self._done and self._throttle.due():
            self._pump()
        return self._queue[0].seq in self._done

    def settled(self) -> Iterator[tuple[FloorBatch, list[Outcome]]]:
        self._pump()
        while self._queue and self._queue[0].seq in self._done:
            batch = self._queue.popleft()
            self._done.discard(batch.seq)
            yield batch, [INDEXED] * len(batch.messages)

    def wait_oldest(self, timeout: float) -> None:
        if self._queue and self._queue[0].seq not in self._done:
            self._pump(max(0.0, timeout))

    def watch(self) -> None:
        """Nothing to tell: a drain of the benchmark's (the indexer's once a second)."""

    def abort(self) -> None:
        pass

    def forget(self, grace: float) -> int:
        """Drops what is unsettled (it is redelivered); a benchmark's drain never has any."""
        dropped = self.messages
        deadline = time.monotonic() + grace
        with contextlib.suppress(OSError, EOFError):
            while any(b.seq not in self._done for b in self._queue):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._pump(min(left, 0.1))
        self._queue.clear()
        self._done.clear()
        return dropped

    def close(self) -> None:
        """The consumer's close at the end of each drain: the child serves every round."""

    def shutdown(self) -> None:
        """When the benchmark is done with it."""
        with contextlib.suppress(OSError):
            self._conn.send(("stop",))
        self._proc.join(10.0)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5.0)
        self._conn.close()
        for p in self.path.parent.glob(self.path.name + "*"):
            p.unlink()


def bus_floor_chunk(
    args: argparse.Namespace,
    pipeline: FloorPipeline,
    engine: SearchEngine,
    topo: Topology,
    config: ConsumerConfig,
    bodies: Sequence[bytes],
    tally: Tally,
) -> None:
    """Publish and prepare the rows (untimed), then time ``IndexerConsumer`` draining
    exactly these through ``pipeline``; CPU counts both processes. ``engine`` is only
    asked its distribution (the in-flight writes and the prefetch follow from it)."""
    prepublish(args.amqp, topo, bodies)
    pipeline.load(bodies)
    gc.collect()
    count = len(bodies)
    _, seconds, cpu, writer_cpu = drain(
        args.amqp, engine, topo.config(config), count, pipeline=pipeline
    )
    tally.add(len(bodies), seconds, cpu, MACHINE.last, writer_cpu)
