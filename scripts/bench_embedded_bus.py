"""The indexer on the embedded Redis bus: Cellsight's Redis transport against kombu's own.

    .venv/bin/python scripts/bench_embedded_bus.py [--count 5000] [--drains 4] [--dir /tmp]

Cellsight's transport (``notifications.redis_transport``) takes every message through a
landing (so that a consumer killed while taking it loses nothing) and reads it before
kombu does (so that one it cannot read is dead-lettered, not lost); this measures what
that costs a readable message. ``--count`` real-size
notifications (``bench.corpus``) are published to a fresh embedded bus, then drained by
the indexer as the CLI runs it (a writer process, the production batch settings) into a
fresh embedded index, once on a connection of each transport per drain, the order
alternating, and by a plain consumer that only acks (``plain_consumer``: its rate, its
CPU and the Redis server's a message). Prints one JSON object: the rates, and ``ratio``
(Cellsight's over kombu's, summed over the drains), with the check's own CPU per message
(``readable_us``, timed on one message in a loop, beside kombu's parse and message for
it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.corpus import Corpus
from kombu import Connection, Queue
from kombu.utils.json import loads

from cellsight.clients import build_bus, build_consumer_config
from cellsight.indexer.consumer import IndexerConsumer
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.write_process import reopened
from cellsight.notifications.bus import Bus
from cellsight.notifications.redis_envelopes import readable
from cellsight.settings import load_settings
from tests.support.indexing import publish_bodies


def connection(bus: Bus, transport: str) -> Connection:
    """``bus.connection()`` is Cellsight's; the bus's own URL gives kombu's transport."""
    if transport == "cellsight":
        return bus.connection()
    return Connection(bus.url, transport_options=bus.transport_options)


def drain(root: Path, transport: str, bodies: list[bytes], tag: str) -> float:
    settings = load_settings(data_dir=root / f"data-{tag}")
    publish_bodies(settings, bodies)
    engine = EmbeddedEngine(root / f"index-{tag}.db")
    engine.ensure_ready("instance")
    try:
        with build_bus(settings) as bus, connection(bus, transport) as conn:
            consumer = IndexerConsumer(
                conn,
                engine,
                build_consumer_config(settings),
                write_process=reopened(engine),
                collect_between_batches=True,
            )
            thread = threading.Thread(target=consumer.run, daemon=True)
            start = time.perf_counter()
            thread.start()
            while consumer.acked < len(bodies) and thread.is_alive():
                time.sleep(0.005)
            seconds = time.perf_counter() - start
            consumer.stop.set()
            thread.join(60)
        if consumer.acked != len(bodies) or engine.count("instance") != len(bodies):
            raise RuntimeError(f"{transport}: acked {consumer.acked} of {len(bodies)}")
    finally:
        engine.close()
    return len(bodies) / seconds


def plain(root: Path, transport: str, bodies: list[bytes], tag: str) -> dict[str, float]:
    """A consumer that only acks, each message, draining ``bodies``: the transport's own
    cost, which the indexer's other work hides. Its process's CPU and the Redis server's
    (``INFO cpu``), a message."""
    settings = load_settings(data_dir=root / f"plain-{tag}")
    publish_bodies(settings, bodies)
    got = 0

    def take(body: Any, message: Any) -> None:
        nonlocal got
        got += 1
        message.ack()

    queue = Queue(settings.indexer_queue, no_declare=True)  # publish_bodies declared it
    with build_bus(settings) as bus, connection(bus, transport) as conn:
        server = conn.default_channel.client

        def server_cpu() -> float:
            info = server.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        with conn.Consumer(queue, callbacks=[take]):
            before, wall, cpu = server_cpu(), time.perf_counter(), time.process_time()
            while got < len(bodies):
                conn.drain_events(timeout=10)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            spent = server_cpu() - before
    return {
        "per_s": len(bodies) / wall,
        "consumer_cpu_us": cpu / len(bodies) * 1e6,
        "server_cpu_us": spent / len(bodies) * 1e6,
    }


def check_cost(root: Path, body: bytes) -> dict[str, float]:
    """The check's CPU on one message as it lies on the list, and kombu's own parse and
    message for it (what the check runs besides: the rest of kombu's receive is not
    repeated)."""
    settings = load_settings(data_dir=root / "data-cost")
    publish_bodies(settings, [body])
    with build_bus(settings) as bus, bus.connection() as conn:
        channel = conn.default_channel
        item = channel.client.rpop(settings.indexer_queue)
        runs = 5000

        def timed(fn: Any) -> float:
            return round(min(timeit.repeat(fn, number=runs, repeat=5)) / runs * 1e6, 2)

        return {
            "item_bytes": len(item),
            "readable_us": timed(lambda: readable(channel, item, settings.indexer_queue)),
            "kombu_parse_and_message_us": timed(
                lambda: channel.Message(loads(item.decode()), channel=channel)
            ),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--drains", type=int, default=4)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cellsight-bench-bus-", dir=args.dir))
    corpus = Corpus(11)
    now = time.time()
    bodies = [corpus.body(i, now) for i in range(args.count)]
    rates: dict[str, list[float]] = {"cellsight": [], "kombu": []}
    plains: dict[str, list[dict[str, float]]] = {"cellsight": [], "kombu": []}
    for d in range(args.drains):
        order = ("cellsight", "kombu") if d % 2 == 0 else ("kombu", "cellsight")
        for transport in order:
            rates[transport].append(drain(root, transport, bodies, f"{transport}-{d}"))
        for transport in order:
            plains[transport].append(plain(root, transport, bodies, f"{transport}-{d}"))

    def plain_figure(name: str) -> dict[str, list[float]]:
        return {k: [round(p[name], 1) for p in v] for k, v in plains.items()}

    def plain_ratio(name: str) -> float:
        total = {k: sum(p[name] for p in v) for k, v in plains.items()}
        return round(total["cellsight"] / total["kombu"], 3)

    print(
        json.dumps(
            {
                "benchmark": "bench_embedded_bus",
                "count": args.count,
                "drains": args.drains,
                "notifications_per_s": {k: [round(r) for r in v] for k, v in rates.items()},
                "ratio": round(sum(rates["cellsight"]) / sum(rates["kombu"]), 3),
                # The same bodies drained by a consumer that only acks (ratios: Cellsight's
                # over kombu's, summed over the drains).
                "plain_consumer": {
                    name: plain_figure(name) | {"ratio": plain_ratio(name)}
                    for name in ("per_s", "consumer_cpu_us", "server_cpu_us")
                },
                **check_cost(root, bodies[0]),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
