"""RabbitMQ for the benchmarks: per-phase topologies and confirmed publishers."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import amqp
from kombu import Connection

from bench.corpus import STAMP, Corpus, oslo_time
from cellsight.indexer.consumer import ConsumerConfig
from cellsight.notifications import queues

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
ROUTING_KEY = queues.routing_key("INFO")


@dataclass(frozen=True)
class Topology:
    """One phase's own exchange, indexer queue and dead-letter pair."""

    exchange: str
    queue: str
    dlx: str
    dlq: str

    @classmethod
    def fresh(cls, phase: str) -> Topology:
        tag = f"{phase}-{uuid.uuid4().hex[:8]}"
        return cls(f"bench-nova-{tag}", f"bench-idx-{tag}", f"bench-dlx-{tag}", f"bench-dlq-{tag}")

    def config(self, base: ConsumerConfig) -> ConsumerConfig:
        """``base``'s batch settings on this topology's names."""
        return replace(
            base,
            exchange=self.exchange,
            queue=self.queue,
            dead_letter_exchange=self.dlx,
            dead_letter_queue=self.dlq,
        )

    def declare(self, conn: Connection) -> None:
        with conn.channel() as ch:
            queues.indexer_queue(self.queue, self.exchange)(ch).declare()
            queues.dead_letter_queue(self.dlq, self.dlx)(ch).declare()

    def depth(self, conn: Connection) -> int:
        with conn.channel() as ch:
            return int(ch.queue_declare(self.queue, passive=True).message_count)

    def dead_letters(self, conn: Connection) -> int:
        with conn.channel() as ch:
            return int(ch.queue_declare(self.dlq, passive=True).message_count)

    def delete(self, url: str) -> None:
        with Connection(url) as conn, conn.channel() as ch:
            for q in (self.queue, self.dlq):
                with contextlib.suppress(Exception):
                    ch.queue_delete(q)
            for x in (self.exchange, self.dlx):
                with contextlib.suppress(Exception):
                    ch.exchange_delete(x)


class ConfirmingPublisher:
    """Persistent publishes with publisher confirms collected asynchronously: the broker
    acks in groups (``multiple``), and ``wait`` blocks until everything sent is confirmed,
    so confirms cost no round trip per message."""

    def __init__(self, conn: Connection, exchange: str) -> None:
        self.conn = conn
        self.channel = conn.channel()
        self.exchange = queues.notifications_exchange(exchange)
        self.exchange(self.channel).declare()
        self.channel.confirm_select()
        self.channel.events["basic_ack"].add(self._ack)
        self.channel.events["basic_nack"].add(self._nack)
        self.sent = 0
        self._upto = 0
        self._single: set[int] = set()
        self.nacked = 0

    def _ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self._upto = max(self._upto, tag)
            self._single = {t for t in self._single if t > self._upto}
        elif tag > self._upto:
            self._single.add(tag)

    def _nack(self, tag: int, multiple: bool) -> None:
        self.nacked += 1

    @property
    def confirmed(self) -> int:
        return self._upto + len(self._single)

    def publish(self, body: bytes) -> None:
        # py-amqp's own publish: what kombu's Producer.publish ends in, minus its
        # per-call preparation (this process must keep up with --lag-rate).
        message = amqp.Message(
            body,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=queues.PERSISTENT,
        )
        self.channel.basic_publish(message, self.exchange.name, ROUTING_KEY)
        self.sent += 1

    def poll(self, timeout: float = 0.0) -> None:
        with contextlib.suppress(TimeoutError, socket.timeout):
            self.conn.drain_events(timeout=timeout)

    def wait(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.confirmed + self.nacked < self.sent:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.confirmed} of {self.sent} publishes confirmed")
            self.poll(1.0)
        if self.nacked:
            raise RuntimeError(f"the broker nacked {self.nacked} publishes")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()


def prepublish(
    url: str, topo: Topology, bodies: Sequence[bytes], group: int = 5000, attempts: int = 3
) -> float:
    """Publish every body with confirms (waited for per ``group``); returns seconds.

    A connection lost mid-way (the broker closed one at 842,000 of a million, on two
    days) is reopened and publishing resumes after what the queue holds: nothing
    consumes it yet and one channel's publishes are enqueued in order, so its depth is
    how many of ``bodies``, from the first, went in."""
    started = time.perf_counter()
    lost: tuple[type[BaseException], ...] = Connection(url).connection_errors
    for attempt in range(1, attempts + 1):
        try:
            with Connection(url) as conn:
                topo.declare(conn)
                done = topo.depth(conn)
                pub = ConfirmingPublisher(conn, topo.exchange)
                for i in range(done, len(bodies)):
                    pub.publish(bodies[i])
                    if (i + 1) % group == 0:
                        pub.wait()
                pub.wait()
                pub.close()
                depth = topo.depth(conn)
            break
        except lost as exc:
            if attempt == attempts:
                raise
            print(f"prepublish: connection lost ({exc!r}), resuming", file=sys.stderr)
    if depth != len(bodies):
        raise RuntimeError(f"queue {topo.queue} holds {depth}, expected {len(bodies)}")
    return time.perf_counter() - started


def steady_publisher(
    url: str, exchange: str, seed: int, offset: int, rate: float, seconds: float, out: Any
) -> None:
    """Child process: publish ``rate``/s for ``seconds``, each notification stamped when
    it is sent; report (uuid, timestamp) pairs and the achieved rate through ``out``."""
    corpus = Corpus(seed)
    total = int(rate * seconds)
    # Built before the clock starts; only the timestamp is filled in when sent.
    bodies = [corpus.body(offset + i, None) for i in range(total)]
    ids = [corpus.instance_uuid(offset + i) for i in range(total)]
    stamps: list[tuple[str, float]] = []
    with Connection(url) as conn:
        pub = ConfirmingPublisher(conn, exchange)
        out.send("ready")
        if out.recv() != "go":
            return
        started = time.time()
        i = 0
        while i < total:
            due = min(total, int((time.time() - started) * rate) + 1)
            while i < due:
                ts = time.time()
                pub.publish(bodies[i].replace(STAMP, oslo_time(ts).encode(), 1))
                stamps.append((ids[i], ts))
                i += 1
            pub.poll(0.0005)  # confirms, and pace at ~1 ms ticks
        elapsed = time.time() - started
        pub.wait()
        pub.close()
    out.send({"stamps": stamps, "seconds": elapsed, "rate": total / elapsed if elapsed else 0})
    out.close()
