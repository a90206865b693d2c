"""The writer process itself: commits the batches its parent sends, in order.

Started by ``write_process.WriteProcess``; what crosses the pipe is in ``write_wire``.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import signal
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from multiprocessing.connection import Connection
from typing import Any

from cellsight.indexer.collector import BatchCollector
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.write_wire import (
    WirePlanned,
    decode_planned,
    encode_outcome,
    pack,
    unpack,
)
from cellsight.indexer.writer import BatchWriter, CellLookup

log = logging.getLogger(__name__)

WriteSide = tuple[SearchEngine, CellLookup | None]
WriterFactory = Callable[[], WriteSide]
"""Builds the child's engine and cell resolver (picklable: a module-level function or a
``functools.partial`` of one, called in the child)."""

WATCH_EVERY = 0.05  # seconds between the child's looks at its abort flag and its parent
IDLE_WAIT = 1.0  # seconds an idle child waits for a batch before its collector's idle check


def child_main(
    conn: Connection,
    factory: WriterFactory,
    in_flight: int,
    aborted: Any,
    parent: int,
    max_backoff: float = 30.0,
) -> None:
    """Commit the batches the parent sends, in order, until told to stop or the parent
    is gone. Signals are the parent's business: a Ctrl-C reaches the whole process
    group, and the child must finish through the parent, not die mid-write."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:  # writer threads report retries while this one sends verdicts
            conn.send_bytes(pack(message))

    try:
        engine, cell_resolver = factory()
    except Exception as exc:
        send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    abort = threading.Event()
    threading.Thread(target=_watch, args=(aborted, parent, abort), daemon=True).start()
    collector = BatchCollector()

    def on_retry() -> None:
        send(("retry",))
        # A commit retrying through an outage reports no batch for as long as it lasts.
        collector.idle()

    writer = BatchWriter(
        engine,
        stop=abort,
        cell_resolver=cell_resolver,
        max_backoff=max_backoff,
        record_metrics=False,
        on_retry=on_retry,
    )
    try:
        send(("ready",))
        with collector:
            _commit_loop(conn, writer, in_flight, send, collector)
    except (EOFError, OSError):
        pass  # the parent is gone: its unacked messages are redelivered
    finally:
        abort.set()
        engine.close()
        conn.close()


def _watch(aborted: Any, parent: int, abort: threading.Event, every: float = WATCH_EVERY) -> None:
    """Turns the parent's abort flag into this process's ``abort`` event, and so does a
    parent that is gone: killed while this child retries through an outage, it would
    leave it retrying forever (the pipe is only read between batches)."""
    while not abort.wait(every):
        if aborted.value or os.getppid() != parent:
            abort.set()


def _commit(writer: BatchWriter, size: int, wire: list[WirePlanned]) -> list[Any]:
    planned = [decode_planned(w) for w in wire]
    final = writer.commit([None] * size, planned)
    return [(p.position, encode_outcome(final[p.position])) for p in planned]


def _receive(conn: Connection, inbox: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
    """Takes batches off the pipe as soon as they arrive, so the consumer's ``send``
    never waits for a commit to end (a batch is larger than a socket's buffer); None
    when the parent is gone. The parent keeps at most ``in_flight + 1`` batches here."""
    while True:
        try:
            message = unpack(conn.recv_bytes())
        except (EOFError, OSError):
            inbox.put(None)
            return
        except Exception:
            # A frame this child cannot read: it stops, and its parent, finding it gone,
            # fails with nothing unwritten acked (the traceback goes to stderr).
            log.exception("writer process: unreadable message from the consumer")
            inbox.put(None)
            return
        inbox.put(message)
        if message[0] == "stop":
            return


def _report(send: Callable[[tuple[Any, ...]], None], seq: int, result: Callable[[], Any]) -> bool:
    """Sends batch ``seq``'s verdicts, or its error (then False: the child stops)."""
    try:
        send(("done", seq, result()))
    except Exception as exc:
        send(("error", seq, f"{type(exc).__name__}: {exc}"))
        return False
    return True


def _commit_loop(
    conn: Connection,
    writer: BatchWriter,
    in_flight: int,
    send: Callable[[tuple[Any, ...]], None],
    collector: BatchCollector,
) -> None:
    """One commit at a time on this thread (a second thread would only contend for the
    GIL with it), or up to ``in_flight`` on a pool for an HTTP engine, reported in order."""
    inbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(conn, inbox), name="receive", daemon=True).start()
    pool = ThreadPoolExecutor(in_flight, "indexer-write") if in_flight > 1 else None
    running: deque[tuple[int, Future[list[Any]]]] = deque()
    try:
        while True:
            while running and running[0][1].done():
                seq, future = running.popleft()
                if not _report(send, seq, future.result):
                    return
                collector.batch_done()
            if len(running) >= in_flight:
                wait([running[0][1]], timeout=0.005)
                continue
            try:
                # Waits longer only when nothing is running; else looks at them again.
                message = inbox.get(timeout=0.005 if running else IDLE_WAIT)
            except queue.Empty:
                if not running:
                    collector.idle()
                continue
            if message is None or message[0] == "stop":
                return
            _, seq, size, wire = message
            if pool is not None:
                running.append((seq, pool.submit(_commit, writer, size, wire)))
                continue
            if not _report(send, seq, functools.partial(_commit, writer, size, wire)):
                return
            del message, wire  # the batch is written: the collector need not walk it
            collector.batch_done()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
