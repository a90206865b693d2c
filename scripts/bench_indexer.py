"""Indexer benchmark: notifications through RabbitMQ into each engine, with two baselines.

    .venv/bin/python scripts/bench_indexer.py [--count 100000] [--engines embedded,osmem]
        [--lag-rate 2000] [--lag-seconds 20] [--one-by-one-count 5000] > result.json

JSON on stdout, progress on stderr. Per engine, in one run:

* **indexer**: ``--count`` real-size notifications (Nova's instance-create-end,
  instance-update and instance-power_off-end samples in turn, one instance uuid each,
  varied names, projects, hosts, flavors, addresses, metadata, tags and timestamps;
  oslo-wrapped, persistent, 2.5-3 KB on the wire) are published to the indexer's queue
  with publisher confirms (not timed), then ``IndexerConsumer`` with the production
  batch settings drains them into the engine: notifications/s from its start to the
  last ack.
* **ceiling** (baseline A): the same notifications mapped to documents before the
  clock starts, then only ``engine.bulk`` in batches of the consumer's batch size, into
  an engine of its own.
* **one by one** (baseline B, how the previous generation worked): a consumer that
  decodes a message, writes its one document (one transaction on the embedded engine,
  one index request on an HTTP engine), then acks it; ``--one-by-one-count`` other
  notifications through their own queue, written into the indexer's engine (so into an
  index of the same size).
* The three are interleaved in ``--rounds`` rounds (a slice of each per round, the
  order rotated), so that on a busy machine they see the same load; ratios come from
  the totals. Beside wall-clock rates, the CPU time of the working thread is reported
  (``cpu_us_*``, and the indexer's per stage): steadier than wall time under load.
* **lag**: a separate process publishes at ``--lag-rate`` for ``--lag-seconds`` while
  the indexer runs; lag = when ``engine.bulk`` returned for a document minus its
  notification's timestamp, per message (the indexer's ``LAG_SECONDS`` histogram is
  reported beside it as a cross-check: the upper bounds of its p50/p99 buckets).

Queues, exchanges, index files and osmem indexes are deleted afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import amqp
from kombu import Connection, Consumer

from indexer import metrics
from indexer.consumer import ConsumerConfig, IndexerConsumer
from indexer.engines.base import SearchEngine, WriteOp, WriteResult, WriteStatus
from indexer.writer import merge_tags, plan
from notifications import queues
from notifications.base import format_timestamp

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "nova-notification-samples"
KINDS = ("instance-create-end", "instance-update", "instance-power_off-end")
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
ROUTING_KEY = queues.routing_key("INFO")

TARGET_EMBEDDED_PER_S = 10_000
TARGET_RATIO_TO_CEILING = 0.80
TARGET_RATIO_TO_ONE_BY_ONE = 20.0
TARGET_LAG_P99_S = 2.0


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# Notifications ------------------------------------------------------------------------
_FLAVORS = [
    ("m1.tiny", 512, 1, 1),
    ("m1.small", 2048, 1, 20),
    ("m1.medium", 4096, 2, 40),
    ("m1.large", 8192, 4, 80),
    ("c5.xlarge", 16384, 8, 100),
    ("r5.2xlarge", 65536, 8, 200),
]
_WORDS = ["web", "db", "cache", "worker", "api", "batch", "etl", "search", "queue", "proxy"]
_ENVS = ["prod", "staging", "dev", "qa"]


STAMP = b"@@@@@@@@@@@@@@@@@@@@@@@@@@"  # as wide as oslo_time's result


def oslo_time(ts: float) -> str:
    """oslo.messaging's timestamp format, microseconds kept (26 characters)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


class Corpus:
    """Real-size Nova notifications, each about a different instance, built from the
    samples with realistic per-instance variation. ``body(i, ts)`` is the oslo-wrapped
    JSON bytes of notification ``i`` stamped ``ts`` (epoch seconds)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        # Kept as text: parsing a fresh copy is ~4x faster than copy.deepcopy.
        self.templates = [(SAMPLES / f"{k}.json").read_text() for k in KINDS]
        rng = random.Random(seed)
        self.projects = [rng.getrandbits(128).to_bytes(16, "big").hex() for _ in range(400)]
        self.images = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(25)]
        self.flavor_ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in _FLAVORS]
        self.base = datetime(2025, 3, 1, tzinfo=UTC)

    def instance_uuid(self, i: int) -> str:
        return str(
            uuid.UUID(int=random.Random(self.seed * 1_000_003 + i).getrandbits(128), version=4)
        )

    def notification(self, i: int, ts: float | None) -> dict[str, Any]:
        """Notification ``i``; ``ts`` None leaves ``STAMP`` in place of the timestamp."""
        rng = random.Random(self.seed * 7_919 + i)
        kind = i % len(KINDS)
        n = json.loads(self.templates[kind])
        d = n["payload"]["nova_object.data"]
        word = rng.choice(_WORDS)
        project = self.projects[rng.randrange(len(self.projects))]
        host = f"compute-{rng.randrange(300):03d}"
        name = f"{word}-{i:07d}"
        created = self.base + timedelta(seconds=i * 3, microseconds=rng.randrange(1_000_000))
        updated = created + timedelta(
            seconds=30 + rng.randrange(600), microseconds=rng.randrange(10**6)
        )
        flavor = rng.randrange(len(_FLAVORS))
        fname, mem, vcpus, disk = _FLAVORS[flavor]
        d.update(
            uuid=self.instance_uuid(i),
            display_name=name,
            display_description=f"{word} server {i} for {rng.choice(_ENVS)}",
            host_name=name,
            tenant_id=project,
            action_initiator_project=project,
            user_id=f"user-{rng.randrange(1500):04d}",
            action_initiator_user=f"user-{rng.randrange(1500):04d}",
            host=host,
            node=f"{host}.cluster.example.org",
            availability_zone=f"az-{rng.randrange(3)}",
            image_uuid=self.images[rng.randrange(len(self.images))],
            key_name=f"key-{rng.randrange(200)}",
            created_at=format_timestamp(created),
            updated_at=format_timestamp(updated),
            request_id=f"req-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            reservation_id=f"r-{rng.getrandbits(40):010x}",
            metadata={
                "env": rng.choice(_ENVS),
                "team": f"team-{rng.randrange(40)}",
                **({"backup": "daily"} if rng.random() < 0.3 else {}),
            },
        )
        if d.get("launched_at") is not None:
            d["launched_at"] = format_timestamp(created + timedelta(seconds=25))
        if "tags" in d and kind == 0:
            d["tags"] = [f"tier-{rng.randrange(3)}", rng.choice(_WORDS)]
        f = d["flavor"]["nova_object.data"]
        f.update(
            name=fname, memory_mb=mem, vcpus=vcpus, root_gb=disk, flavorid=self.flavor_ids[flavor]
        )
        for ip in d.get("ip_addresses", []):
            ipd = ip["nova_object.data"]
            ipd.update(
                address=f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
                mac="fa:16:3e:" + ":".join(f"{rng.randrange(256):02x}" for _ in range(3)),
                port_uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                device_name=f"tap{rng.getrandbits(40):010x}"[:14],
            )
        for bdm in d.get("block_devices", []):
            bdm["nova_object.data"]["volume_id"] = str(
                uuid.UUID(int=rng.getrandbits(128), version=4)
            )
        n["publisher_id"] = f"nova-compute:{host}"
        n["message_id"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        # oslo.messaging's timestamp format, microseconds kept.
        n["timestamp"] = STAMP.decode() if ts is None else oslo_time(ts)
        return n

    def body(self, i: int, ts: float | None) -> bytes:
        inner = json.dumps(self.notification(i, ts))
        return json.dumps({"oslo.version": "2.0", "oslo.message": inner}).encode()


# Bus ----------------------------------------------------------------------------------
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


def prepublish(url: str, topo: Topology, bodies: Sequence[bytes], group: int = 5000) -> float:
    """Publish every body with confirms (waited for per ``group``); returns seconds."""
    started = time.perf_counter()
    with Connection(url) as conn:
        topo.declare(conn)
        pub = ConfirmingPublisher(conn, topo.exchange)
        for i, body in enumerate(bodies, 1):
            pub.publish(body)
            if i % group == 0:
                pub.wait()
        pub.wait()
        pub.close()
        depth = topo.depth(conn)
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


# Engines ------------------------------------------------------------------------------
class EngineSite:
    """Hands out fresh, empty engines (several may be live at once) and cleans up."""

    name = "?"

    def fresh(self, phase: str) -> SearchEngine:
        raise NotImplementedError

    def release(self, engine: SearchEngine) -> None:
        engine.close()

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {}


class EmbeddedSite(EngineSite):
    name = "embedded"

    def __init__(self, root: Path) -> None:
        from indexer.engines.embedded import EmbeddedEngine

        self.cls = EmbeddedEngine
        self.root = Path(tempfile.mkdtemp(prefix="cellsight-bench-", dir=root))

    def fresh(self, phase: str) -> SearchEngine:
        engine = self.cls(self.root / f"{phase}.db", prefix="bench")
        engine.ensure_ready("instance")
        engine.ensure_ready("node")
        return engine

    def release(self, engine: SearchEngine) -> None:
        engine.close()
        path = Path(engine.path)  # type: ignore[attr-defined]
        for p in path.parent.glob(path.name + "*"):
            p.unlink()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.root), "synchronous": "NORMAL (engine default)"}


class OsmemSite(EngineSite):
    """One osmem server per engine benchmark; each engine its own prefix, its indexes
    dropped on release (osmem holds ~16 KB per document in memory)."""

    name = "osmem"

    def __init__(self) -> None:
        from osmem_server import OsmemServer

        from indexer.engines.opensearch import OpenSearchEngine

        self.cls = OpenSearchEngine
        self.server: Any = OsmemServer.start(japanese=False)

    def fresh(self, phase: str) -> SearchEngine:
        engine = self.cls(self.server.url, prefix=f"bench-{phase}", timeout=60.0)
        engine.ensure_ready("instance")
        engine.ensure_ready("node")
        return engine

    def release(self, engine: SearchEngine) -> None:
        with contextlib.suppress(Exception):
            for resource in ("instance", "node"):
                for info in engine.indexes(resource):
                    engine.drop_index(info.name)
        engine.close()

    def close(self) -> None:
        self.server.close()

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"server": "osmem-server", "version": version("osmem-server")}


class Stages:
    """CPU seconds of the indexer thread per stage, from wrappers around the engine and
    around ``indexer.writer``'s ``decode`` and ``plan`` (installed for one phase only)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - started

        return wrapper

    @contextlib.contextmanager
    def on_writer(self) -> Iterator[None]:
        import indexer.writer as w

        saved = w.decode, w.plan
        w.decode, w.plan = self.timed("decode", w.decode), self.timed("plan", w.plan)
        try:
            yield
        finally:
            w.decode, w.plan = saved

    def breakdown(self, thread_cpu: float, count: int) -> dict[str, float]:
        """Microseconds of CPU per notification: decode (JSON, envelope, payload
        validation), map (version and document), engine write (``bulk``), engine reads
        (stored tags of tag-less payloads, purge floor), and the rest of the thread:
        AMQP receive, ack, batching."""
        c = self.cpu
        parts = {
            "decode": c.get("decode", 0.0),
            "map": c.get("plan", 0.0) - c.get("decode", 0.0),
            "engine_write": c.get("bulk", 0.0),
            "engine_reads": c.get("get_many", 0.0) + c.get("get_meta", 0.0),
        }
        parts["amqp_ack_and_rest"] = thread_cpu - sum(parts.values())
        return {k: round(v / count * 1e6, 1) for k, v in parts.items()}


class Instrumented:
    """The engine, recording when ``bulk`` returned for each document it took, and the
    CPU time of its calls into ``stages``."""

    def __init__(self, engine: SearchEngine, stages: Stages | None = None) -> None:
        self._engine = engine
        self.stages = stages or Stages()
        self.done: dict[str, float] = {}
        self._bulk = self.stages.timed("bulk", engine.bulk)
        self.get_many = self.stages.timed("get_many", engine.get_many)
        self.get_meta = self.stages.timed("get_meta", engine.get_meta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        results: list[WriteResult] = self._bulk(ops)
        now = time.time()
        for op, r in zip(ops, results, strict=True):
            if r.status is WriteStatus.OK:
                self.done.setdefault(op.id, now)
        return results


def documents_in(engine: SearchEngine) -> int:
    engine.refresh("instance")
    return engine.count("instance")


# Phases -------------------------------------------------------------------------------
def run_indexer(
    url: str,
    engine: Any,
    config: ConsumerConfig,
    until: Callable[[IndexerConsumer], bool],
    timeout: float,
    profile: Path | None = None,
) -> tuple[IndexerConsumer, float, float]:
    """Run an IndexerConsumer on a thread until ``until(consumer)``; returns it, the
    seconds from its start to that moment, and the CPU seconds its thread used."""
    conn = Connection(url)
    consumer = IndexerConsumer(conn, engine, config)
    prof: Any = None
    clock: list[int] = []

    def target() -> None:
        nonlocal prof
        clock.append(time.pthread_getcpuclockid(threading.get_ident()))
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
    started = time.perf_counter()
    thread.start()
    deadline = time.monotonic() + timeout
    while not until(consumer):
        if not thread.is_alive():
            raise RuntimeError("the indexer thread died")
        if time.monotonic() > deadline:
            consumer.stop.set()
            raise RuntimeError(f"indexer timed out after {timeout}s at {consumer.acked} acked")
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    cpu = time.clock_gettime(clock[0])
    consumer.stop.set()
    thread.join(60)
    conn.release()
    if prof is not None and profile is not None:
        prof.dump_stats(str(profile))
    return consumer, elapsed, cpu


@dataclass
class Tally:
    """One phase's totals over the rounds."""

    count: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    rounds: list[float] | None = None

    def add(self, count: int, seconds: float, cpu: float) -> None:
        self.count += count
        self.seconds += seconds
        self.cpu += cpu
        self.rounds = [*(self.rounds or []), round(count / seconds, 1)]

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else math.nan

    def summary(self, unit: str) -> dict[str, Any]:
        return {
            unit: self.count,
            "seconds": round(self.seconds, 3),
            f"{unit}_per_s": round(self.rate, 1),
            "per_s_by_round": self.rounds,
            "cpu_seconds": round(self.cpu, 3),
            f"cpu_us_per_{unit.rstrip('s')}": round(self.cpu / self.count * 1e6, 1),
        }


def ceiling_chunk(engine: SearchEngine, bodies: Sequence[bytes], batch: int, tally: Tally) -> int:
    """engine.bulk of these notifications' documents, mapped before the clock starts,
    in batches of the consumer's size. Returns how many the engine took."""
    spent = cpu = 0.0
    written = 0
    for start in range(0, len(bodies), batch):
        _, planned = plan(bodies[start : start + batch])
        merge_tags(planned, {})  # what the indexer stores for new tag-less payloads
        ops = [p.op for p in planned]
        del planned
        t, c = time.perf_counter(), time.thread_time()
        results = engine.bulk(ops)
        spent += time.perf_counter() - t
        cpu += time.thread_time() - c
        written += sum(r.status is WriteStatus.OK for r in results)
    tally.add(len(bodies), spent, cpu)
    return written


def indexer_chunk(
    args: argparse.Namespace,
    engine: Instrumented,
    topo: Topology,
    config: ConsumerConfig,
    bodies: Sequence[bytes],
    tally: Tally,
    totals: dict[str, int],
    profile: Path | None,
) -> None:
    """Publish (untimed), then time an IndexerConsumer draining exactly these."""
    prepublish(args.amqp, topo, bodies)
    gc.collect()
    with engine.stages.on_writer():
        consumer, seconds, cpu = run_indexer(
            args.amqp,
            engine,
            topo.config(config),
            lambda c: c.acked >= len(bodies),
            timeout=max(600.0, len(bodies) / 100),
            profile=profile,
        )
    if consumer.acked != len(bodies):
        raise RuntimeError(f"the indexer acked {consumer.acked} of {len(bodies)}")
    for verdict, n in consumer.totals.items():
        totals[verdict] = totals.get(verdict, 0) + n
    tally.add(len(bodies), seconds, cpu)


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


def throughput(
    args: argparse.Namespace,
    site: EngineSite,
    bodies: Sequence[bytes],
    one_bodies: Sequence[bytes],
    config: ConsumerConfig,
) -> dict[str, Any]:
    """Ceiling, indexer and one-by-one interleaved in ``--rounds`` rounds, each round in
    a rotated order, so that all three see the same machine load on average. The
    one-by-one consumer writes into the indexer's engine right beside it (an index of
    the same size); the ceiling fills its own engine with the same documents."""
    rounds = max(1, min(args.rounds, len(bodies), len(one_bodies) or args.rounds))
    ceiling_engine = site.fresh("ceiling")
    indexer_engine = site.fresh("indexer")
    stages = Stages()
    instrumented = Instrumented(indexer_engine, stages)
    idx_topo, one_topo = Topology.fresh("indexer"), Topology.fresh("onebyone")
    tallies = {"ceiling": Tally(), "indexer": Tally(), "one_by_one": Tally()}
    totals: dict[str, int] = {}
    took = failed = 0
    prof = Path(args.profile_dir) / f"indexer-{site.name}" if args.profile_dir else None
    try:
        for r in range(rounds):
            chunk = bodies[r * len(bodies) // rounds : (r + 1) * len(bodies) // rounds]
            ones = one_bodies[r * len(one_bodies) // rounds : (r + 1) * len(one_bodies) // rounds]
            order = ["ceiling", "indexer", "one_by_one"]
            order = order[r % 3 :] + order[: r % 3]
            for phase in order if r % 2 == 0 else reversed(order):
                if phase == "ceiling":
                    took += ceiling_chunk(ceiling_engine, chunk, config.batch_count, tallies[phase])
                elif phase == "indexer":
                    where = prof.with_name(f"{prof.name}-{r}.prof") if prof else None
                    indexer_chunk(
                        args, instrumented, idx_topo, config, chunk, tallies[phase], totals, where
                    )
                elif ones:
                    failed += one_by_one_chunk(
                        args, indexer_engine, one_topo, ones, config.prefetch, tallies[phase]
                    )
            say(
                f"  {site.name} round {r + 1}/{rounds}: "
                + ", ".join(f"{k} {t.rounds[-1]:,.0f}/s" for k, t in tallies.items() if t.rounds)
            )
        with Connection(args.amqp) as conn:
            left = idx_topo.depth(conn) + (one_topo.depth(conn) if one_bodies else 0)
            dead = idx_topo.dead_letters(conn)
        ceiling_docs = documents_in(ceiling_engine)
        indexer_docs = documents_in(indexer_engine)
    finally:
        site.release(ceiling_engine)
        site.release(indexer_engine)
        idx_topo.delete(args.amqp)
        one_topo.delete(args.amqp)
    ind = tallies["indexer"]
    return {
        "rounds": rounds,
        "ceiling": {
            **tallies["ceiling"].summary("docs"),
            "batch": config.batch_count,
            "taken": took,
            "documents_after": ceiling_docs,
        },
        "indexer": {
            **ind.summary("notifications"),
            "cpu_us_per_notification_by_stage": stages.breakdown(ind.cpu, ind.count),
            "verdicts": totals,
            "queues_left": left,
            "dead_lettered": dead,
            "documents_after": indexer_docs,
            "documents_expected": len(bodies) + len(one_bodies),
        },
        "one_by_one": (
            {**tallies["one_by_one"].summary("notifications"), "failed_writes": failed}
            if one_bodies
            else {}
        ),
    }


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


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


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
        started = time.monotonic()
        go = [False]

        def until(consumer: IndexerConsumer) -> bool:
            if not go[0] and time.monotonic() - started > 0.5:  # the consumer is up
                receive.send("go")
                go[0] = True
            if go[0] and not report and receive.poll():
                report.update(receive.recv())
            return bool(report) and consumer.acked >= total

        child.start()
        if not receive.poll(300) or receive.recv() != "ready":
            raise RuntimeError("the lag publisher did not start")
        say(f"  {site.name} lag: publishing {args.lag_rate:,.0f}/s for {args.lag_seconds}s")
        started = time.monotonic()
        _, seconds, cpu = run_indexer(
            args.amqp,
            clock,
            topo.config(config),
            until,
            timeout=args.lag_seconds + 600,
        )
        child.join(30)
        after = _lag_histogram()
        lags = [clock.done[u] - ts for u, ts in report["stamps"] if u in clock.done]
        missing = sum(1 for u, _ in report["stamps"] if u not in clock.done)
        p50, p99 = quantile(lags, 0.50), quantile(lags, 0.99)
        say(f"  {site.name} lag: p50 {p50:.3f}s p99 {p99:.3f}s max {max(lags):.3f}s")
        return {
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
            "drain_seconds_after_publish": round(max(0.0, seconds - 0.5 - report["seconds"]), 2),
            "indexer_cpu_share": round(cpu / seconds, 3),
        }
    finally:
        site.release(engine)
        topo.delete(args.amqp)


# Main ---------------------------------------------------------------------------------
def target(name: str, value: float, threshold: float, op: str = ">=") -> dict[str, Any]:
    ok = value >= threshold if op == ">=" else value <= threshold
    return {"target": name, "value": value, "threshold": f"{op} {threshold:g}", "pass": bool(ok)}


def bench_engine(
    args: argparse.Namespace, site: EngineSite, corpus: Corpus, count: int
) -> dict[str, Any]:
    config = ConsumerConfig(
        batch_count=args.batch_count,
        batch_bytes=args.batch_bytes,
        batch_age=args.batch_age,
        prefetch=args.prefetch,
    )
    say(f"{site.name}: building {count:,} + {args.one_by_one_count:,} notifications")
    ts0 = time.time() - 3600
    bodies = [corpus.body(i, ts0 + i / 1000) for i in range(count)]
    one_bodies = [corpus.body(5_000_000 + i, ts0) for i in range(args.one_by_one_count)]
    tp = throughput(args, site, bodies, one_bodies, config)
    del bodies, one_bodies
    gc.collect()
    lag = phase_lag(args, site, corpus.seed, config) if args.lag_seconds > 0 else None

    ind, ceil, one = tp["indexer"], tp["ceiling"], tp["one_by_one"]
    rate = ind["notifications_per_s"]
    one_rate = one.get("notifications_per_s")
    result: dict[str, Any] = {
        "count": count,
        "notifications_per_s": rate,
        "ceiling_docs_per_s": ceil["docs_per_s"],
        "ratio_to_ceiling": round(rate / ceil["docs_per_s"], 3),
        "one_by_one_per_s": one_rate,
        "ratio_to_one_by_one": round(rate / one_rate, 1) if one_rate else None,
        "lag_p50_s": lag["lag_p50_s"] if lag else None,
        "lag_p99_s": lag["lag_p99_s"] if lag else None,
        # CPU time of the thread doing the work: steadier than wall time on a busy
        # machine. Comparable across phases only for the embedded engine (an HTTP
        # engine's own work happens in the server, outside this process).
        "cpu_us_per_notification": ind["cpu_us_per_notification"],
        "ceiling_cpu_us_per_doc": ceil["cpu_us_per_doc"],
        "one_by_one_cpu_us_per_notification": one.get("cpu_us_per_notification"),
        "cpu_ratio_to_ceiling": None,
        "cpu_ratio_to_one_by_one": None,
        **tp,
        "lag": lag,
        "engine": site.describe(),
    }
    if site.name == "embedded":
        result["cpu_ratio_to_ceiling"] = round(
            ceil["cpu_us_per_doc"] / ind["cpu_us_per_notification"], 3
        )
        if one:
            result["cpu_ratio_to_one_by_one"] = round(
                one["cpu_us_per_notification"] / ind["cpu_us_per_notification"], 1
            )
    checks = []
    if site.name == "embedded":
        checks.append(target("notifications_per_s", rate, TARGET_EMBEDDED_PER_S))
    checks.append(target("ratio_to_ceiling", result["ratio_to_ceiling"], TARGET_RATIO_TO_CEILING))
    if one:
        checks.append(
            target("ratio_to_one_by_one", result["ratio_to_one_by_one"], TARGET_RATIO_TO_ONE_BY_ONE)
        )
    if lag:
        checks.append(target("lag_p99_s", lag["lag_p99_s"], TARGET_LAG_P99_S, "<="))
    result["targets"] = checks
    problems = []
    if ind["documents_after"] != ind["documents_expected"]:
        problems.append(f"indexer engine holds {ind['documents_after']} documents")
    if ind["dead_lettered"] or ind["queues_left"] or one.get("failed_writes"):
        problems.append("dead letters, leftover messages or failed one-by-one writes")
    if ceil["documents_after"] != count or ceil["taken"] != count:
        problems.append(f"ceiling engine holds {ceil['documents_after']} documents")
    if lag and (lag["missing"] or lag["indexed"] != lag["published"]):
        problems.append(f"lag: {lag['missing']} published notifications never written")
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
    p.add_argument("--count", type=int, default=100_000, help="notifications per engine")
    p.add_argument("--osmem-count", type=int, default=None, help="override --count for osmem")
    p.add_argument("--engines", default="embedded,osmem")
    p.add_argument("--lag-rate", type=float, default=2000.0)
    p.add_argument("--lag-seconds", type=float, default=20.0)
    p.add_argument("--one-by-one-count", type=int, default=5000)
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleave ceiling, indexer and one-by-one in this many rounds",
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
            "one_by_one_count": args.one_by_one_count,
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
    }
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if name not in sites:
            p.error(f"unknown engine {name!r} (embedded, osmem)")
        site = sites[name]()
        count = args.osmem_count if name == "osmem" and args.osmem_count else args.count
        try:
            out["engines"][name] = bench_engine(args, site, corpus, count)
        finally:
            site.close()
        gc.collect()
    out["host"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["targets"] = [
        {"engine": name, **t} for name, r in out["engines"].items() for t in r["targets"]
    ]
    out["all_pass"] = all(t["pass"] for t in out["targets"])
    out["notes"] = notes(out)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
