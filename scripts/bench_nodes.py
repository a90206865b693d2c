"""Node queries: the node state cache warm, cold snapshots, and one query per node.

    .venv/bin/python scripts/bench_nodes.py [--cells 20] [--nodes 500] [--runs 30] [--dir /tmp]

Seeds ``--cells`` SQLite cells of ``--nodes`` compute nodes each, then times the node
query the API runs (``cellsight.api.query2.nodes``: the cache's ``get`` and the in-memory filter
``offline or disabled``), ``--runs`` times each, p50 and p95 in milliseconds:

* ``warm``: every entry fresh, served from memory (a repeated filter is remembered per
  snapshot); ``warm_filter_evaluated``: the same with the filter evaluated over every
  cached node each time;
* ``cold``: ``bypass=True``, a snapshot of every cell (one SELECT per cell, in parallel
  through the fan-out pool) and a refill;
* ``per_node``: the baseline a cache replaces, one SELECT per node (fewer runs: it is
  the slow one).

Also counts the queries one cold snapshot sends each cell (it must be 1). Prints one
JSON object with the ratios ``cold_over_warm`` and ``per_node_over_cold``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa

from cellsight.api.fanout import FanOut
from cellsight.api.query2.evaluate import Deadline
from cellsight.api.query2.node_cache import NodeCache
from cellsight.api.query2.nodes import _from_cells, select
from cellsight.api.query2.sexpr import parse_filter
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.schema import compute_nodes, utcnow
from cellsight.indexer.documents import comparable
from cellsight.indexer.row_documents import node_row_document

FILTER = ["|", ["?", "offline"], ["?", "disabled"]]


def unbound() -> Deadline:
    """No bound on the evaluation: the benchmark times it."""
    return Deadline(float("inf"))


def seed(root: Path, cells: int, nodes: int) -> CellRegistry:
    registry = CellRegistry(f"sqlite:///{root / 'api.db'}")
    registry.create_schema()
    now = utcnow()
    for c in range(cells):
        cell = registry.add_cell(f"cell{c:02d}", f"sqlite:///{root / f'cell{c:02d}.db'}")
        rows = [
            {
                "uuid": str(uuidlib.uuid4()),
                "host": f"c{c:02d}-h{n:04d}",
                "hypervisor_hostname": f"c{c:02d}-h{n:04d}",
                "availability_zone": "nova",
                "memory_mb": 262_144,
                "memory_mb_used": (n * 977) % 262_144,
                "vcpus": 64,
                "vcpus_used": n % 64,
                "local_gb": 4000,
                "local_gb_used": n % 4000,
                "forthcoming_reservations": n % 3,
                "disabled": n % 97 == 0,
                "offline": n % 89 == 0,
                "created_at": now,
                "updated_at": now,
                "revision": 1,
                "deleted": False,
            }
            for n in range(nodes)
        ]
        with registry.cell_engine(cell).begin() as conn:
            conn.execute(compute_nodes.insert(), rows)
    return registry


def timed(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.95))], 3),
        "runs": runs,
    }


def per_node(fanout: FanOut, cells: list[CellMapping], uuids: dict[str, list[str]]) -> int:
    """The baseline: each node's row read on its own."""
    found = 0
    for cell in cells:
        with fanout.engine(cell).connect() as conn:
            for node in uuids[cell.uuid]:
                row = (
                    conn.execute(sa.select(compute_nodes).where(compute_nodes.c.uuid == node))
                    .mappings()
                    .first()
                )
                if row is not None:
                    comparable(node_row_document(cast(Mapping[str, Any], row), cell.uuid))
                    found += 1
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        registry = seed(Path(tmp), args.cells, args.nodes)
        cells = registry.list_cells()
        fanout = FanOut(cell_timeout=30.0)
        queries = dict.fromkeys((c.uuid for c in cells), 0)

        def counter(cell_uuid: str) -> Callable[..., None]:
            def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
                if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
                    queries[cell_uuid] += 1

            return count

        for cell in cells:
            sa.event.listen(fanout.engine(cell), "before_cursor_execute", counter(cell.uuid))
        cache = NodeCache(registry.list_cells, lambda cs: _from_cells(list(cs), fanout))
        tree = parse_filter("node", FILTER)
        first = cache.get()
        assert len(first.documents) == args.cells * args.nodes, len(first.documents)
        per_cell = sorted(set(queries.values()))
        matched = len(select(first, tree, unbound()))
        warm = timed(lambda: select(cache.get(), tree, unbound()), args.runs)

        def evaluated() -> None:
            snapshot = cache.get()
            snapshot.selections.clear()  # the filter evaluated over every cached node
            select(snapshot, tree, unbound())

        warm_evaluated = timed(evaluated, args.runs)
        cold = timed(lambda: select(cache.get(bypass=True), tree, unbound()), args.runs)
        uuids: dict[str, list[str]] = {c.uuid: [] for c in cells}
        for doc in first.documents:
            uuids[str(doc["cell_uuid"])].append(str(doc["uuid"]))
        slow = timed(lambda: per_node(fanout, cells, uuids), max(3, args.runs // 10))
        fanout.close()
        registry.close()
    print(
        json.dumps(
            {
                "cells": args.cells,
                "nodes_per_cell": args.nodes,
                "nodes": args.cells * args.nodes,
                "filter": FILTER,
                "matched": matched,
                "queries_per_cell_per_snapshot": per_cell,
                "warm": warm,
                "warm_filter_evaluated": warm_evaluated,
                "cold": cold,
                "per_node": slow,
                "cold_over_warm": round(cold["p50_ms"] / warm["p50_ms"], 1),
                "cold_over_warm_filter_evaluated": round(
                    cold["p50_ms"] / warm_evaluated["p50_ms"], 1
                ),
                "per_node_over_cold": round(slow["p50_ms"] / cold["p50_ms"], 1),
                "hits": cache.hits,
                "misses": cache.misses,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
