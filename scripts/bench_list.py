"""Benchmark the server list: index path vs fan-out vs the previous generation.

Builds (or reuses) N cells x M instances, indexes them with a full bulk sync into the
embedded engine, then times six request types through the real app (detail view,
limit 1000): as an administrator listing all tenants, the default sort, a sort by name,
a filtered list and a walk of 50 pages by marker; as a member, its own project's listing
(the largest project and the smallest). Three contenders answer each:

* ``index``: Cellsight's index path (embedded engine);
* ``fanout``: Cellsight's fan-out path (same app, index not used);
* ``reference``: the previous generation's cross-cell listing, implemented here: each
  cell queried with the full limit, one cell after another, rows merged and cut.

Prints one JSON object: per contender and request type, p50/p99 milliseconds and the
rows read per cell; the setup times; the speed-ups.

Usage: python scripts/bench_list.py [--cells 20] [--instances 50000] [--dir DIR]
       [--dialect sqlite|mariadb] [--repeat 20] [--pages 50]
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import sqlalchemy as sa
from fastapi.testclient import TestClient

from cellsight.api.app import create_app, freeze_startup_objects
from cellsight.api.auth import dev_principal
from cellsight.api.cell_documents import search_cell
from cellsight.api.merge_order import order_key, sort_values
from cellsight.api.microversion import MIN
from cellsight.api.params import parse_list_query
from cellsight.api.paths import InstanceSearch
from cellsight.api.render import LinkContext, detail
from cellsight.cells.database import Engines, connect
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.seed import seed
from cellsight.cells.seeddata import seeded_projects
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.sync import SyncOptions, run_sync
from cellsight.query.tree import SearchRequest
from cellsight.settings import load_settings

ADMIN = "bench:admin"
Params = list[tuple[str, str]]
ALL = [("all_tenants", "1"), ("limit", "1000")]


def requests_of(seed: int) -> dict[str, tuple[Params, str]]:
    """Each request type's query and the token it is sent with: an administrator's
    listings of all tenants, and a member's own listing (Nova scopes it to the member's
    project) for the largest and the smallest of the seed's projects."""
    projects = seeded_projects(seed)
    return {
        "default_sort": (ALL, ADMIN),
        "sort_by_name": (
            [*ALL, ("sort_key", "display_name"), ("sort_dir", "asc")],
            ADMIN,
        ),
        "filtered": ([*ALL, ("status", "ACTIVE"), ("availability_zone", "az1")], ADMIN),
        "project_largest": ([("limit", "1000")], f"bench:{projects[0]}"),
        "project_smallest": ([("limit", "1000")], f"bench:{projects[-1]}"),
    }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(ordered[index] * 1000, 1)


def setup(args: argparse.Namespace) -> tuple[CellRegistry, EmbeddedEngine, dict[str, Any]]:
    root: Path = args.dir
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / f"ready-{args.dialect}-{args.cells}x{args.instances}.json"
    registry = CellRegistry(f"sqlite:///{root / f'api-{args.dialect}.db'}", Engines())
    registry.create_schema()
    engine = EmbeddedEngine(root / f"index-{args.dialect}.db")
    if stamp.exists():
        return registry, engine, json.loads(stamp.read_text())
    if registry.list_cells():
        raise SystemExit(f"{root} holds a partial setup; remove it first")
    urls: list[str] = []
    if args.dialect == "mariadb":
        server = sa.make_url(args.mariadb_url)
        admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for _ in range(args.cells):
                name = f"cs_bench_{uuid.uuid4().hex[:8]}"
                conn.exec_driver_sql(f"CREATE DATABASE {name}")
                urls.append(server.set(database=name).render_as_string(hide_password=False))
        admin.dispose()
    log(f"seeding {args.cells} x {args.instances} ({args.dialect})")
    report = seed(
        registry,
        cells=args.cells,
        instances_per_cell=args.instances,
        cells_dir=root / "cells",
        db_urls=urls,
        seed=1,
    )
    log(f"seeded in {report.seconds:.0f}s; bulk sync into the embedded engine")
    started = time.perf_counter()
    sync = run_sync(engine, registry, SyncOptions())
    info = {
        "seed_seconds": round(report.seconds, 1),
        "sync_seconds": round(time.perf_counter() - started, 1),
        "documents": sync.documents,
    }
    stamp.write_text(json.dumps(info))
    return registry, engine, info


def reference_page(
    registry: CellRegistry, engines: Engines, params: Params, token: str, marker_after: Any
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The previous generation: every cell asked for the full limit, one after another."""
    query = parse_list_query(params, dev_principal(token), max_limit=1000, version=MIN)
    request = SearchRequest(query.filter, query.order, query.limit, marker_after)
    per_cell: list[list[dict[str, Any]]] = []
    rows_read: dict[str, int] = {}
    for cell in registry.list_cells():
        with connect(engines.get(cell.database_url)) as conn:
            docs = search_cell(conn, request, cell.uuid)
        rows_read[cell.name] = len(docs)
        per_cell.append(docs)
    merged = list(heapq.merge(*per_cell, key=order_key(query.order)))[: query.limit]
    return merged, rows_read


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    fn()  # warm caches and connections
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return times, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--instances", type=int, default=50_000)
    parser.add_argument("--dir", type=Path, default=Path(".bench-list"))
    parser.add_argument("--dialect", choices=("sqlite", "mariadb"), default="sqlite")
    parser.add_argument("--mariadb-url", default="mysql+pymysql://root@127.0.0.1:3306/mysql")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--min-batch", type=int, default=100, help="fan-out batch floor")
    args = parser.parse_args()

    registry, engine, info = setup(args)
    settings = load_settings(data_dir=args.dir / "data", cell_timeout=60.0)
    # Two apps over the same cells: one whose index is synced (the index path), one
    # whose index is empty and unsynced (so the fan-out path answers).
    index_app = create_app(settings, engine=engine, registry=registry)
    empty = EmbeddedEngine(args.dir / "data" / "empty-index.db", prefix="empty")
    fanout_app = create_app(settings, engine=empty, registry=registry)
    fanout_app.state.fanout.min_batch = args.min_batch
    search: InstanceSearch = fanout_app.state.search
    clients = {"index": TestClient(index_app), "fanout": TestClient(fanout_app)}
    freeze_startup_objects()  # as `cellsight api` does once its app has started
    ref_engines = Engines(statement_timeout=60.0)
    results: dict[str, Any] = {
        "setup": info,
        "cells": args.cells,
        "instances": args.instances,
        "dialect": args.dialect,
        "min_batch": args.min_batch,
    }

    def ctx(token: str) -> LinkContext:
        """Rendered as the API renders for that principal (admin-only fields or not)."""
        return LinkContext("http://testserver", None, MIN, dev_principal(token).is_admin)

    def via_app(params: Params, token: str, path: str) -> Callable[[], Any]:
        def call() -> Any:
            response = clients[path].get(
                f"/v2.1/servers/detail?{urlencode(params)}", headers={"X-Auth-Token": token}
            )
            assert response.status_code == 200, response.text
            assert response.headers["X-Cellsight-Path"] == path, response.headers
            return response.json()

        return call

    requests = requests_of(seed=1)
    for name, (params, token) in requests.items():
        log(f"timing {name}")
        entry: dict[str, Any] = {}
        bodies = {}
        for path in ("index", "fanout"):
            times, bodies[path] = timed(via_app(params, token, path), args.repeat)
            entry[path] = {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)}

        def ref(params: Params = params, token: str = token) -> Any:
            docs, rows = reference_page(registry, ref_engines, params, token, None)
            return {"servers": [detail(d, ctx(token)) for d in docs]}, rows

        times, (body, rows) = timed(ref, args.repeat)
        entry["reference"] = {
            "p50_ms": percentile(times, 0.5),
            "p99_ms": percentile(times, 0.99),
            "rows_read_total": sum(rows.values()),
            "rows_read_per_cell": round(statistics.mean(rows.values()), 1),
        }
        assert body["servers"] == bodies["fanout"]["servers"] == bodies["index"]["servers"]
        entry["servers"] = len(body["servers"])
        principal = dev_principal(token)
        query = parse_list_query(params, principal, max_limit=1000, version=MIN)
        page = search.search(
            SearchRequest(query.filter, query.order, query.limit), principal, prefer_index=False
        )
        entry["fanout"]["rows_read_total"] = sum(page.rows_read.values())
        entry["fanout"]["rows_read_per_cell"] = round(statistics.mean(page.rows_read.values()), 1)
        entry["fanout"]["rows_read_max_cell"] = max(page.rows_read.values())
        results[name] = entry

    log(f"walking {args.pages} pages")
    walk: dict[str, Any] = {}
    params, token = requests["default_sort"]
    for path in ("index", "fanout"):
        url = f"/v2.1/servers/detail?{urlencode(params)}"
        times = []
        ids: list[str] = []
        for _ in range(args.pages):
            started = time.perf_counter()
            response = clients[path].get(url, headers={"X-Auth-Token": token})
            times.append(time.perf_counter() - started)
            assert response.headers["X-Cellsight-Path"] == path
            body = response.json()
            ids.extend(s["id"] for s in body["servers"])
            parts = urlsplit(body["servers_links"][0]["href"])
            url = f"{parts.path}?{parts.query}"
        walk[path] = {
            "p50_ms": percentile(times, 0.5),
            "p99_ms": percentile(times, 0.99),
            "total_s": round(sum(times), 2),
            "servers": len(ids),
            "unique": len(set(ids)),
        }
    times, after = [], None
    query = parse_list_query(params, dev_principal(token), max_limit=1000, version=MIN)
    ref_ids: list[str] = []
    rows_total = 0
    for _ in range(args.pages):
        started = time.perf_counter()
        docs, rows = reference_page(registry, ref_engines, params, token, after)
        [detail(d, ctx(token)) for d in docs]
        times.append(time.perf_counter() - started)
        rows_total += sum(rows.values())
        ref_ids.extend(d["uuid"] for d in docs)
        after = sort_values(docs[-1], query.order)
    walk["reference"] = {
        "p50_ms": percentile(times, 0.5),
        "p99_ms": percentile(times, 0.99),
        "total_s": round(sum(times), 2),
        "servers": len(ref_ids),
        "rows_read_total": rows_total,
    }
    results["walk_50_pages"] = walk
    speedups = {}
    for name in (*requests, "walk_50_pages"):
        ref_p50 = results[name]["reference"]["p50_ms"]
        speedups[name] = {
            "index_vs_reference": round(ref_p50 / max(results[name]["index"]["p50_ms"], 0.01), 1),
            "fanout_vs_reference": round(ref_p50 / max(results[name]["fanout"]["p50_ms"], 0.01), 1),
        }
    results["speedup_p50"] = speedups
    for client in clients.values():
        client.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
