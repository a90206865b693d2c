"""The engine's reads and writes in a child process, so the consumer's process keeps the bus.

One indexer process spends its CPU in parts that all hold Python's GIL: receiving from
the bus, decoding and mapping, and the engine's write (building rows or bulk lines, the
version reads, the SQL or HTTP calls). Writer threads only take turns at them. With a
writer process, the consumer's process receives, decodes, maps, acks and dead-letters as
before; ``BatchWriter.commit`` (tag merge, purge floor, cell lookup, the versioned bulk
write and its retries) runs in the child, with its own engine client. That is the same
cut as between the consumer's thread and its writer threads, so every rule of the
in-process pipeline holds: batches are committed and settled in the order they were
planned (the consumer's ``multiple`` ack stays correct), and two batches in flight
never share an instance id.

What crosses is small and cheap to encode (``write_wire``), and the child's loop is in
``write_child``. Metrics are recorded by the parent, from the verdicts and from
the retries the child reports, so one ``/metrics`` endpoint shows them.

The child is told to stop, or finds its parent gone (the pipe closes, or its parent
process changes), and then abandons its retries; whatever it had not reported stays
unacked in the broker and is redelivered.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cellsight.indexer import metrics
from cellsight.indexer.amqp_deliveries import Received
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.inflight import Ordered, PlannedBatch
from cellsight.indexer.outcomes import Outcome, dead
from cellsight.indexer.write_child import WriterFactory, WriteSide, child_main
from cellsight.indexer.write_wire import (
    WireOutcome,
    decode_outcome,
    encode_planned,
    pack,
    unpack,
    widen,
)
from cellsight.indexer.writer import BatchWriter, record_outcomes
from cellsight.signal_events import ignored_while_spawning

log = logging.getLogger(__name__)

__all__ = ["WriteProcess", "WriterFactory", "WriterProcessFailed", "engine_side", "reopened"]


def reopened(engine: SearchEngine) -> WriterFactory:
    """A factory of another client of ``engine``'s storage, with no cell resolver."""
    return functools.partial(engine_side, engine.reopener())


STARTUP_TIMEOUT = 60.0  # seconds for the child to import and build its engine
# The consumer asks whether a batch settled after every message; looking at the pipe
# costs a poll() system call (measured 20 µs of the consumer's thread each time), so it
# looks at most this often (a batch takes tens of milliseconds to write).
PUMP_EVERY = 0.001  # seconds
ALIVE_EVERY = 1.0  # seconds between an idle consumer's checks that the child lives
CLOSE_GRACE = 10.0  # seconds a closing child has to finish its write before SIGKILL


class PumpThrottle:
    """Says when a pipe is due a look: at most every ``PUMP_EVERY`` seconds."""

    def __init__(self) -> None:
        self._last = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < PUMP_EVERY:
            return False
        self._last = now
        return True


class WriterProcessFailed(RuntimeError):
    """The writer process died, could not start, or its write raised an error that is not
    transient; nothing it had not reported is acked."""


def engine_side(build: Callable[[], SearchEngine]) -> WriteSide:
    """The engine ``build`` opens and no cell resolver (payloads that carry their cell)."""
    return build(), None


@dataclass
class SentBatch:
    seq: int
    messages: list[Received]
    outcomes: list[Outcome | None]
    ids: frozenset[str]
    started: float


class WriteProcess(Ordered):
    """At most ``in_flight`` batches being committed in the child (one more waiting in
    the pipe, so the child never idles), settled in order. ``inflight.Pipeline``."""

    def __init__(self, factory: WriterFactory, in_flight: int, writer: BatchWriter) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no copy of our sockets or locks
        self.writer = writer  # plans batches here, as with writer threads
        self.in_flight = in_flight
        self.limit = in_flight + 1
        self._conn, child_conn = ctx.Pipe()
        widen(self._conn)
        widen(child_conn)
        # A flag in shared memory, not a multiprocessing Event: setting an Event whose
        # waiter was killed blocks forever (its condition waits for the sleeper to wake).
        self._abort = ctx.RawValue(ctypes.c_bool, False)
        self._proc = ctx.Process(
            target=child_main,
            args=(child_conn, factory, in_flight, self._abort, os.getpid(), writer.max_backoff),
            name="indexer-writer",
            daemon=True,
        )
        # Started with SIGINT ignored (it ignores it once running: signals are its
        # parent's business): a Ctrl-C while it was importing killed it, and its indexer
        # failed, "writer process exited (code -2)" (a review).
        with ignored_while_spawning((signal.SIGINT,)):
            self._proc.start()
        child_conn.close()
        self._queue: deque[SentBatch] = deque()
        self._done: dict[int, list[tuple[int, WireOutcome]] | WriterProcessFailed] = {}
        self._seq = 0
        self._forgotten = 0  # verdicts of batches up to this one are dropped
        self._throttle = PumpThrottle()
        self._checked_alive = 0.0
        self._closed = False
        try:
            self._await_ready()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _await_ready(self) -> None:
        if not self._conn.poll(STARTUP_TIMEOUT):
            raise WriterProcessFailed(f"writer process not ready after {STARTUP_TIMEOUT:.0f}s")
        kind, *rest = self._recv()
        if kind != "ready":
            raise WriterProcessFailed(f"writer process could not start: {rest[-1]}")

    def _gone(self) -> WriterProcessFailed:
        self._proc.join(0.5)
        return WriterProcessFailed(f"writer process exited (code {self._proc.exitcode})")

    def _recv(self) -> tuple[Any, ...]:
        try:
            message = unpack(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise self._gone() from exc
        except Exception as exc:  # a frame that cannot be read: nothing more is trusted
            raise WriterProcessFailed(
                f"unreadable message from the writer process: {type(exc).__name__}: {exc}"
            ) from exc
        return message

    def _pump(self, timeout: float = 0.0) -> None:
        """Take whatever the child has sent (waiting up to ``timeout`` for the first)."""
        while self._conn.poll(timeout):
            timeout = 0.0
            kind, *rest = self._recv()
            if kind == "retry":
                metrics.RETRIES.inc()
                metrics.ENGINE_UP.set(0)  # until a batch is settled again
            elif rest[0] <= self._forgotten:
                continue
            elif kind == "done":
                self._done[rest[0]] = rest[1]
            elif kind == "error":
                self._done[rest[0]] = WriterProcessFailed(f"write failed: {rest[1]}")

    def can_take(self, batch: PlannedBatch) -> bool:
        # Batches are committed in order, but ``in_flight`` > 1 commits several at once.
        committing = list(self._queue)[-self.in_flight :] if self.in_flight > 1 else []
        return len(self._queue) < self.limit and not any(b.ids & batch.ids for b in committing)

    def launch(self, batch: PlannedBatch) -> None:
        self._seq += 1
        wire = [encode_planned(p) for p in batch.planned]
        try:
            self._conn.send_bytes(pack(("batch", self._seq, len(batch.outcomes), wire)))
        except OSError as exc:
            raise self._gone() from exc
        sent = SentBatch(self._seq, batch.messages, batch.outcomes, batch.ids, time.perf_counter())
        self._queue.append(sent)

    def any_settled(self) -> bool:
        if not self._queue:
            now = time.monotonic()
            if now - self._checked_alive >= ALIVE_EVERY:
                # An idle indexer whose writer died must not wait for traffic to notice.
                self._checked_alive = now
                if not self._proc.is_alive():
                    raise self._gone()
            return False
        if self._queue[0].seq not in self._done and self._throttle.due():
            self._pump()
        return self._queue[0].seq in self._done

    def settled(self) -> Iterator[tuple[SentBatch, list[Outcome]]]:
        """Finished batches from the oldest on; a failed one raises here (it and every
        later batch stay unacked)."""
        self._pump()
        while self._queue and self._queue[0].seq in self._done:
            batch = self._queue.popleft()
            result = self._done.pop(batch.seq)
            if isinstance(result, WriterProcessFailed):
                raise result
            outcomes = batch.outcomes
            for position, wire in result:
                outcomes[position] = decode_outcome(wire)
            final = [o if o is not None else dead("internal", "no verdict") for o in outcomes]
            metrics.ENGINE_UP.set(1)
            record_outcomes(final)
            yield batch, final

    def wait_oldest(self, timeout: float) -> None:
        if self._queue and self._queue[0].seq not in self._done:
            self._pump(max(0.0, timeout))

    def abort(self) -> None:
        """Stop retrying: a write blocked by an outage is abandoned, unacked."""
        self._abort.value = True

    def forget(self, grace: float) -> int:
        """Drop every batch unsettled (redelivered later); wait up to ``grace`` seconds for
        the child to finish what it is writing, so it cannot race the redelivery."""
        dropped = self.messages
        deadline = time.monotonic() + grace
        with contextlib.suppress(WriterProcessFailed):
            while any(b.seq not in self._done for b in self._queue):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("a write is still running after %.1fs; leaving it", grace)
                    break
                self._pump(min(left, 0.1))
        self._queue.clear()
        self._done.clear()
        self._forgotten = self._seq
        return dropped

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abort.value = True
        with contextlib.suppress(OSError):
            self._conn.send_bytes(pack(("stop",)))
        self._proc.join(CLOSE_GRACE)
        if self._proc.is_alive():
            # The child ignores SIGTERM (signals are the parent's business), and a
            # stopped or wedged one never reads "stop": only SIGKILL ends it, and what it
            # held is unacked, so the broker redelivers it. Without this, a SIGSTOPped
            # writer held the indexer's shutdown (and multiprocessing's join at exit)
            # forever.
            log.warning(
                "writer process %s did not stop within %.0fs; killing it", self.pid, CLOSE_GRACE
            )
            self._proc.kill()
            self._proc.join(5.0)
        self._conn.close()
