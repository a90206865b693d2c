"""Whole drains: the indexer and the plain consumer each drain all ``--count``
notifications in one go, alternating, ``--drains`` times.

The interleaved rounds (``phases.throughput``) give each phase ``count / rounds``
notifications at a time: with the defaults, 4,000, four of the consumer's batches. A
pipelined indexer pays its fill (the first batch is received and decoded before any
write starts) and its tail (the last batch is written with nothing left to decode) once
per drain, so on four batches they weigh about a fifth of its time, where a plain
consumer has neither. A whole drain of 20,000 (twenty batches) is what the issue's
``--count 20000`` asks to drain and is nearer an audit burst's steady pace; both figures
are reported, each against the plain consumer of the same length. On the embedded
engine the bus + floor consumer (``bench/bus_floor.py``) drains them too, into an empty
index of its own: the ratio's limit over whole drains.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bench.bus import Topology
from bench.bus_floor import FloorPipeline, bus_floor_chunk
from bench.measure import Instrumented, Stages, Tally, say
from bench.phases import indexer_chunk, plain_chunk
from bench.sites import EmbeddedSite, EngineSite
from cellsight.indexer.consumer import ConsumerConfig
from cellsight.indexer.write_process import reopened


def whole_drains(
    args: argparse.Namespace,
    site: EngineSite,
    bodies: Sequence[bytes],
    config: ConsumerConfig,
    prefetch: int,
) -> dict[str, Any]:
    """``args.drains`` sets, the set's order rotating and alternating; the indexer runs
    as the CLI does (a writer process), each drain into an empty engine of its own (the
    bus + floor consumer into an empty index of its own); the plain consumer with the
    prefetch the rounds gave it."""
    names = ["indexer_wp", "plain"] + (["bus_floor"] if isinstance(site, EmbeddedSite) else [])
    tallies = {name: Tally() for name in names}
    totals: dict[str, int] = {}
    held: list[int] = []
    floored: list[int] = []
    for d in range(args.drains):
        order = names[d % len(names) :] + names[: d % len(names)]
        for phase in order if d % 2 == 0 else reversed(order):
            topo = Topology.fresh(f"drain-{phase}")
            try:
                if phase == "plain":
                    plain_chunk(args, topo, bodies, prefetch, tallies[phase])
                    continue
                engine = site.fresh(f"drain-{d}")
                if phase == "bus_floor":
                    assert isinstance(site, EmbeddedSite)
                    pipeline = FloorPipeline(site.root / f"drain-bus-floor-{d}.db")
                    try:
                        bus_floor_chunk(
                            args, pipeline, engine, topo, config, bodies, tallies[phase]
                        )
                        floored.append(pipeline.documents())
                    finally:
                        pipeline.shutdown()
                        site.release(engine)
                    continue
                try:
                    indexer_chunk(
                        args,
                        Instrumented(engine, Stages()),
                        topo,
                        config,
                        bodies,
                        tallies[phase],
                        totals,
                        None,
                        write_process=reopened(engine),
                    )
                    held.append(engine.count("instance"))
                finally:
                    site.release(engine)
            finally:
                topo.delete(args.amqp)
        say(
            f"  {site.name} whole drain {d + 1}/{args.drains} of {len(bodies):,}: "
            + ", ".join(f"{k} {t.rounds[-1]:,.0f}/s" for k, t in tallies.items() if t.rounds)
        )
    wp, plain = tallies["indexer_wp"], tallies["plain"]
    return {
        "notifications_per_drain": len(bodies),
        "drains": args.drains,
        "indexer_write_process": {
            **wp.summary("notifications"),
            "verdicts": totals,
            "documents_after_each": held,
        },
        "plain_consumer": plain.summary("messages"),
        "ratio_to_plain_consumer": round(wp.rate / plain.rate, 3),
        "bus_floor": (
            {
                **tallies["bus_floor"].summary("notifications"),
                "documents_after_each": floored,
                "ratio_to_plain_consumer": round(tallies["bus_floor"].rate / plain.rate, 3),
            }
            if "bus_floor" in tallies
            else {}
        ),
    }
