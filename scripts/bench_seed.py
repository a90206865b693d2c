"""Measure seeding: N cells x M instances into SQLite in a temporary directory.

Prints one JSON object: {"cells", "rows", "seconds", "rows_per_s", ...}.
Usage: python scripts/bench_seed.py [--cells 4] [--instances 100000] [--chunk-size 10000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from cellsight.cells.database import Engines
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.seed import seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=4)
    parser.add_argument("--instances", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cellsight-bench-") as tmp:
        root = Path(tmp)
        registry = CellRegistry(f"sqlite:///{root / 'api.db'}", Engines())
        registry.create_schema()
        try:
            report = seed(
                registry,
                cells=args.cells,
                instances_per_cell=args.instances,
                cells_dir=root / "cells",
                chunk_size=args.chunk_size,
            )
        finally:
            registry.close()
        size = sum(p.stat().st_size for p in root.rglob("*.db"))
    print(
        json.dumps(
            {
                "cells": args.cells,
                "rows": report.instances,
                "mappings": report.mappings,
                "compute_nodes": report.compute_nodes,
                "seconds": round(report.seconds, 3),
                "rows_per_s": round(report.rows_per_s),
                "database_mb": round(size / 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
