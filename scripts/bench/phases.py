"""The timed phases of the indexer benchmark, interleaved in rounds.

* **indexer**: ``IndexerConsumer`` drains prepublished notifications into the engine,
  with its writer threads in this process.
* **indexer_wp**: the same with a writer process (``cellsight.indexer.write_process``),
  as ``cellsight indexer`` runs by default; CPU counts both processes.
* **plain**: a kombu consumer that only receives and acks (``basic.ack`` with
  ``multiple`` every 500) the same kind of queue: the bus's own pace.
* **ceiling**: ``engine.bulk`` of the same documents, mapped before the clock starts.
* **floor** (embedded engine): the same documents' rows, built before the clock starts,
  through the same SQL with nothing else (``bench/floor.py``): what the ceiling cannot beat.
* **bus_floor** (embedded engine): the indexer's consumer receiving and acking as the CLI
  does, with the floor's SQL in a writer process behind it and nothing decoded
  (``bench/bus_floor.py``): what the ratio to the plain consumer cannot beat.
* **one_by_one**: decode, write one document, ack, message by message.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kombu import Connection, Consumer

from bench.bus import Topology, prepublish
from bench.bus_floor import FloorPipeline, bus_floor_chunk
from bench.ceiling import ceiling_chunk, taken
from bench.floor import FloorWriter
from bench.indexer_run import drain
from bench.measure import MACHINE, Instrumented, Stages, Tally, documents_in, say
from bench.one_by_one import one_by_one_chunk
from bench.sites import EmbeddedSite, EngineSite
from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.write_process import WriterFactory, reopened
from cellsight.notifications import queues

PLAIN_ACK_EVERY = 500


def indexer_chunk(
    args: argparse.Namespace,
    engine: Instrumented,
    topo: Topology,
    config: ConsumerConfig,
    bodies: Sequence[bytes],
    tally: Tally,
    totals: dict[str, int],
    profile: Path | None,
    write_process: WriterFactory | None = None,
) -> None:
    """Publish (untimed), then time an IndexerConsumer draining exactly these. With a
    writer process it runs as the CLI runs it, with no clock around its stages: the
    child's stages are not seen here, and the bus thread's wrapper (two thread-clock
    system calls per receive, about 3% of the consumer's CPU) would be bench overhead
    that only the indexer's side of a ratio pays."""
    prepublish(args.amqp, topo, bodies)
    gc.collect()
    # Planning (decode + map) is clocked with a writer process too: twice a batch.
    with engine.stages.on_writer():
        consumer, seconds, cpu, writer_cpu = drain(
            args.amqp,
            engine,
            topo.config(config),
            len(bodies),
            stages=engine.stages if write_process is None else None,
            profile=profile,
            write_process=write_process,
        )
    for verdict, n in consumer.totals.items():
        totals[verdict] = totals.get(verdict, 0) + n
    tally.add(len(bodies), seconds, cpu, MACHINE.last, writer_cpu)


def plain_chunk(
    args: argparse.Namespace, topo: Topology, bodies: Sequence[bytes], prefetch: int, tally: Tally
) -> None:
    """The bus's own pace: receive and ack only, one ``multiple`` ack per 500."""
    prepublish(args.amqp, topo, bodies)
    done = 0
    last: Any = None

    def on_message(message: Any) -> None:
        nonlocal done, last
        done += 1
        last = message
        if done % PLAIN_ACK_EVERY == 0:
            message.channel.basic_ack(message.delivery_tag, multiple=True)

    gc.collect()
    with Connection(args.amqp) as conn, conn.channel() as ch:
        queue = queues.indexer_queue(topo.queue, topo.exchange)
        ch.basic_qos(0, prefetch, False)
        with (
            MACHINE.section(),
            Consumer(ch, queues=[queue], on_message=on_message, prefetch_count=prefetch),
        ):
            started, cpu0 = time.perf_counter(), time.thread_time()
            while done < len(bodies):
                with contextlib.suppress(TimeoutError, socket.timeout):
                    conn.drain_events(timeout=5.0)
            if done % PLAIN_ACK_EVERY:
                last.channel.basic_ack(last.delivery_tag, multiple=True)
            seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu0
        tally.add(done, seconds, cpu, MACHINE.last)


def _slice(items: Sequence[bytes], r: int, rounds: int) -> Sequence[bytes]:
    return items[r * len(items) // rounds : (r + 1) * len(items) // rounds]


def throughput(
    args: argparse.Namespace,
    site: EngineSite,
    bodies: Sequence[bytes],
    one_bodies: Sequence[bytes],
    config: ConsumerConfig,
) -> dict[str, Any]:
    """The phases interleaved in ``--rounds`` rounds, each round in a rotated order, so
    that all see the same machine load on average. The one-by-one consumer writes into
    the indexer's engine right beside it (an index of the same size); the ceiling fills
    its own engine with the same documents; the plain consumer drains the same bodies
    from a queue of its own."""
    rounds = max(1, min(args.rounds, len(bodies), len(one_bodies) or args.rounds))
    ceiling_engine = site.fresh("ceiling")
    # The embedded engine's floor: the same rows through the same SQL, nothing else.
    floor = FloorWriter(site.root / "floor.db") if isinstance(site, EmbeddedSite) else None
    # The ratio target's limit: the indexer's consumer, the floor's SQL behind it.
    bus_floor = (
        FloorPipeline(site.root / "bus_floor.db") if isinstance(site, EmbeddedSite) else None
    )
    indexer_engine = site.fresh("indexer")
    wp_engine = site.fresh("indexer_wp")
    stages = Stages()
    instrumented = Instrumented(indexer_engine, stages)
    wp_stages = Instrumented(wp_engine, Stages())  # the child's stages are not seen here
    queued = ["indexer", "indexer_wp", "onebyone", "plain"] + (
        ["bus_floor"] if bus_floor is not None else []
    )
    topos = {p: Topology.fresh(p) for p in queued}
    names = ["ceiling", "indexer", "indexer_wp", "one_by_one", "plain"]
    names += ["floor", "bus_floor"] if floor is not None else []
    tallies = {name: Tally() for name in names}
    totals: dict[str, int] = {}
    wp_totals: dict[str, int] = {}
    took = failed = floored = 0
    prefetch = config.prefetch_for(config.in_flight_for(indexer_engine))
    prof = Path(args.profile_dir) / f"indexer-{site.name}" if args.profile_dir else None
    try:
        for r in range(rounds):
            chunk, ones = _slice(bodies, r, rounds), _slice(one_bodies, r, rounds)
            order = names[r % len(names) :] + names[: r % len(names)]
            for phase in order if r % 2 == 0 else reversed(order):
                if phase == "ceiling":
                    took += ceiling_chunk(
                        ceiling_engine.bulk, chunk, config.batch_count, tallies[phase], count=taken
                    )
                elif phase == "floor" and floor is not None:
                    floored += ceiling_chunk(
                        floor.write, chunk, config.batch_count, tallies[phase], floor.prepare
                    )
                elif phase == "indexer":
                    where = prof.with_name(f"{prof.name}-{r}.prof") if prof else None
                    indexer_chunk(
                        args,
                        instrumented,
                        topos["indexer"],
                        config,
                        chunk,
                        tallies[phase],
                        totals,
                        where,
                    )
                elif phase == "indexer_wp":
                    indexer_chunk(
                        args,
                        wp_stages,
                        topos["indexer_wp"],
                        config,
                        chunk,
                        tallies[phase],
                        wp_totals,
                        None,
                        write_process=reopened(wp_engine),
                    )
                elif phase == "plain":
                    plain_chunk(args, topos["plain"], chunk, prefetch, tallies[phase])
                elif phase == "bus_floor" and bus_floor is not None:
                    bus_floor_chunk(
                        args, bus_floor, wp_engine, topos[phase], config, chunk, tallies[phase]
                    )
                elif phase == "one_by_one" and ones:
                    failed += one_by_one_chunk(
                        args,
                        indexer_engine,
                        topos["onebyone"],
                        ones,
                        config.prefetch,
                        tallies[phase],
                    )
            say(
                f"  {site.name} round {r + 1}/{rounds}: "
                + ", ".join(f"{k} {t.rounds[-1]:,.0f}/s" for k, t in tallies.items() if t.rounds)
            )
        with Connection(args.amqp) as conn:
            used = [t for name, t in topos.items() if name != "onebyone" or one_bodies]
            left = sum(t.depth(conn) for t in used)
            dead = topos["indexer"].dead_letters(conn)
            wp_dead = topos["indexer_wp"].dead_letters(conn)
        ceiling_docs = documents_in(ceiling_engine)
        floor_docs = documents_in(floor.engine) if floor is not None else 0
        bus_floor_docs = bus_floor.documents() if bus_floor is not None else 0
        indexer_docs = documents_in(indexer_engine)
        wp_docs = documents_in(wp_engine)
    finally:
        site.release(ceiling_engine)
        if floor is not None:
            site.release(floor.engine)  # closes it and removes its files
        if bus_floor is not None:
            bus_floor.shutdown()
        site.release(indexer_engine)
        site.release(wp_engine)
        for topo in topos.values():
            topo.delete(args.amqp)
    ind = tallies["indexer"]
    return {
        "rounds": rounds,
        "ceiling": {
            **tallies["ceiling"].summary("docs"),
            "batch": config.batch_count,
            "taken": took,
            "documents_after": ceiling_docs,
        },
        "floor": (
            {**tallies["floor"].summary("docs"), "written": floored, "documents_after": floor_docs}
            if floor is not None
            else {}
        ),
        # Indexer-shaped (receive, batch, ack) with no decode, map or engine Python.
        "bus_floor": (
            {**tallies["bus_floor"].summary("notifications"), "documents_after": bus_floor_docs}
            if bus_floor is not None
            else {}
        ),
        "indexer": {
            **ind.summary("notifications"),
            "cpu_us_per_notification_by_stage": stages.breakdown(ind.cpu, ind.count),
            "writes_in_flight": config.in_flight_for(indexer_engine),
            "prefetch": prefetch,
            "verdicts": totals,
            "queues_left": left,
            "dead_lettered": dead,
            "documents_after": indexer_docs,
            "documents_expected": len(bodies) + len(one_bodies),
        },
        "indexer_write_process": {
            **tallies["indexer_wp"].summary("notifications"),
            # Decode + map as the CLI runs it: plans held until sent, not until written.
            "decode_map_us_per_notification": round(
                wp_stages.stages.cpu.get("plan", 0.0) / max(1, tallies["indexer_wp"].count) * 1e6,
                1,
            ),
            "writes_in_flight": config.in_flight_for(wp_engine),
            "verdicts": wp_totals,
            "dead_lettered": wp_dead,
            "documents_after": wp_docs,
            "documents_expected": len(bodies),
        },
        "plain_consumer": {**tallies["plain"].summary("messages"), "ack_every": PLAIN_ACK_EVERY},
        "one_by_one": (
            {**tallies["one_by_one"].summary("notifications"), "failed_writes": failed}
            if one_bodies
            else {}
        ),
    }
