"""The previous generation's consumer, the one-by-one baseline: decode, write one
document, ack, message by message."""

from __future__ import annotations

import argparse
import contextlib
import gc
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from kombu import Connection, Consumer

from bench.bus import Topology, prepublish
from bench.measure import Tally
from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteStatus
from cellsight.indexer.writer import plan
from cellsight.notifications import queues


def single_writer(engine: SearchEngine) -> Callable[[WriteOp], bool]:
    """One request (or transaction) per document; True when it was taken or stale.

    The embedded engine: ``bulk`` with a single op, one transaction. An HTTP engine's
    ``bulk`` also resolves the write alias first (one more request, amortised over a
    batch by the indexer), so here it is one versioned index request to the write
    alias, as a one-write-per-notification consumer would send it."""
    client = getattr(engine, "client", None)
    if client is None:

        def bulk_one(op: WriteOp) -> bool:
            status = engine.bulk([op])[0].status
            return status in (WriteStatus.OK, WriteStatus.STALE)

        return bulk_one
    from opensearchpy.exceptions import ConflictError

    def index_one(op: WriteOp) -> bool:
        with contextlib.suppress(ConflictError):  # stale: a newer version is stored
            client.index(
                index=engine.write_alias(op.resource),
                id=op.id,
                body=op.document,
                version=op.version,
                version_type="external",
            )
        return True

    return index_one


def one_by_one_chunk(
    args: argparse.Namespace,
    engine: SearchEngine,
    topo: Topology,
    bodies: Sequence[bytes],
    prefetch: int,
    tally: Tally,
) -> int:
    """The previous generation: decode, write one document, ack; message by message.
    Returns how many writes failed."""
    prepublish(args.amqp, topo, bodies)
    write_one = single_writer(engine)
    done = failed = 0

    def on_message(message: Any) -> None:
        nonlocal done, failed
        _, planned = plan([message.body])
        for p in planned:
            failed += not write_one(p.op)
        message.ack()
        done += 1

    gc.collect()
    with Connection(args.amqp) as conn, conn.channel() as ch:
        queue = queues.indexer_queue(topo.queue, topo.exchange)
        ch.basic_qos(0, prefetch, False)
        started, cpu0 = time.perf_counter(), time.thread_time()
        with Consumer(ch, queues=[queue], on_message=on_message, prefetch_count=prefetch):
            while done < len(bodies):
                with contextlib.suppress(TimeoutError, socket.timeout):
                    conn.drain_events(timeout=5.0)
        tally.add(done, time.perf_counter() - started, time.thread_time() - cpu0)
    return failed
