"""Load test of the fan-out path: concurrent clients listing by fan-out over loopback.

Seeds ``--cells`` SQLite cells (``--instances`` each), serves the real app with
uvicorn on a free loopback port (an empty, unsynced index: every listing fans out),
and runs ``--clients`` threads, each listing ``/v2.1/servers/detail`` (administrator,
all tenants, ``--limit``) back to back for ``--seconds``. Every answer is checked:
a skipped cell on a healthy cluster is a false "cell down" (counted); 503s are
admission refusals (counted, with their ``Retry-After``).

Prints one JSON object: requests/s, latency p50/p99 (ms), status counts, responses
that reported skipped cells.

Usage: python scripts/load_fanout.py [--clients 50] [--seconds 60] [--cells 10]
       [--instances 2000] [--limit 100] [--dir DIR] [--admission-wait S]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cellsight.api.app import create_app  # noqa: E402
from cellsight.api.headers import PATH, SKIPPED_CELLS  # noqa: E402
from cellsight.cells.database import Engines  # noqa: E402
from cellsight.cells.mappings import CellRegistry  # noqa: E402
from cellsight.cells.seed import seed  # noqa: E402
from cellsight.indexer.engines.embedded import EmbeddedEngine  # noqa: E402
from cellsight.settings import load_settings  # noqa: E402

ADMIN = {"X-Auth-Token": "load:admin"}


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    skipped: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    client_errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _client(base: str, url: str, until: float, tally: Tally) -> None:
    with httpx.Client(base_url=base, headers=ADMIN, timeout=120.0) as http:
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                response = http.get(url)
            except httpx.HTTPError as exc:
                with tally.lock:
                    tally.client_errors[type(exc).__name__] += 1
                continue
            elapsed = time.perf_counter() - started
            with tally.lock:
                tally.latencies.append(elapsed)
                tally.statuses[response.status_code] += 1
                tally.paths[response.headers.get(PATH, "-")] += 1
                if response.headers.get(SKIPPED_CELLS):
                    tally.skipped += 1


def run_load(base: str, *, clients: int, seconds: float, limit: int = 100) -> dict[str, Any]:
    """``clients`` threads listing for ``seconds``; the figures as a dict."""
    url = f"/v2.1/servers/detail?all_tenants=1&limit={limit}"
    tally = Tally()
    until = time.monotonic() + seconds
    started = time.monotonic()
    threads = [
        threading.Thread(target=_client, args=(base, url, until, tally)) for _ in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    ms = sorted(x * 1000 for x in tally.latencies)
    return {
        "clients": clients,
        "seconds": round(wall, 2),
        "requests": len(ms),
        "requests_per_s": round(len(ms) / wall, 1),
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1) if ms else None,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "paths": dict(tally.paths),
        "responses_with_skipped_cells": tally.skipped,
        "client_errors": dict(tally.client_errors),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--admission-wait", type=float, default=None, help="Default: fanout_admission_wait"
    )
    args = parser.parse_args(argv)

    from tests.support.serve import serving  # uvicorn, as ``cellsight api`` runs it

    work = args.dir or Path(tempfile.mkdtemp(prefix="cellsight-load-"))
    work.mkdir(parents=True, exist_ok=True)
    registry = CellRegistry(f"sqlite:///{work / 'api.db'}", Engines(statement_timeout=10.0))
    registry.create_schema()
    if not registry.list_cells():
        seed(
            registry,
            cells=args.cells,
            instances_per_cell=args.instances,
            cells_dir=work / "cells",
            seed=5,
        )
    overrides: dict[str, Any] = {"cell_timeout": 5.0}
    if args.admission_wait is not None:
        overrides["fanout_admission_wait"] = args.admission_wait
    settings = load_settings(data_dir=work / "data", **overrides)
    engine = EmbeddedEngine(work / "empty-index.db", prefix="load")
    app = create_app(settings, engine=engine, registry=registry)
    with serving(app) as base:
        figures = run_load(base, clients=args.clients, seconds=args.seconds, limit=args.limit)
    figures.update(
        cells=len(registry.list_cells()),
        instances_per_cell=args.instances,
        admission_wait_s=settings.fanout_admission_wait,
        workers=settings.fanout_workers,
    )
    print(json.dumps(figures, indent=2))
    engine.close()
    registry.close()
    return 0 if figures["responses_with_skipped_cells"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
