"""What each secondary index of the embedded engine costs a live write, alone.

    .venv/bin/python scripts/bench_index_costs.py [--docs 200000] [--batch 1000] [--dir /tmp]
        [--layout current|earlier]

For the table alone, then the table with each index of the layout in turn (``current``:
``sqlite_schema.INDEXED_COLUMNS``; ``earlier``: the one before 2026-11-24, in
``tests/support/layouts.py``), the same rows (``bench_embedded.build``: creation order,
random uuids) go through the same SQL with
nothing else: the first half loaded untimed, then the second half timed, in batches, with
checkpoints off so that the WAL's growth counts the pages each batch dirtied. Prints one
JSON object: per index, CPU µs (this thread) and WAL KiB per document, and both above
the table alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cellsight.indexer.engines.sqlite_rows import Prepared, RowBuilder
from cellsight.indexer.engines.sqlite_schema import INDEXED_COLUMNS, SCHEMAS, quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_embedded import build

from tests.support.layouts import EARLIER_LAYOUT


def cost(
    workdir: Path, prepared: list[Prepared], batch: int, columns: tuple[str, ...] | None
) -> dict[str, float]:
    path = workdir / "costs.db"
    schema = SCHEMAS["instance"]
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("page_size=8192", "journal_mode=WAL", "synchronous=NORMAL"):
        conn.execute(f"PRAGMA {pragma}")
    conn.execute("PRAGMA cache_size=-65536")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(schema.create_sql("t")[0])
    if columns is not None:
        conn.execute(f"CREATE INDEX i ON t ({', '.join(quote(c) for c in columns)})")
    insert = schema.insert_sql("t")
    half = len(prepared) // 2

    def load(lo: int, hi: int) -> None:
        for k in range(lo, hi, batch):
            rows = [(k + n + 1, *p.row) for n, p in enumerate(prepared[k : min(k + batch, hi)])]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(insert, rows)
            conn.execute("COMMIT")

    load(0, half)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cpu = time.thread_time()
    load(half, len(prepared))
    cpu = time.thread_time() - cpu
    wal = (path.parent / (path.name + "-wal")).stat().st_size
    conn.close()
    for leftover in workdir.iterdir():
        leftover.unlink()
    measured = len(prepared) - half
    return {
        "cpu_us_per_doc": round(cpu / measured * 1e6, 1),
        "wal_kib_per_doc": round(wal / measured / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--layout", choices=("current", "earlier"), default="current")
    args = parser.parse_args()
    builder = RowBuilder(SCHEMAS["instance"])
    prepared = [builder.prepare(op) for op in build(args.docs)]
    gc.freeze()
    layout = INDEXED_COLUMNS["instance"] if args.layout == "current" else EARLIER_LAYOUT["instance"]
    out: dict[str, Any] = {
        "docs": args.docs,
        "measured": args.docs - args.docs // 2,
        "batch": args.batch,
        "layout": args.layout,
        "cpus": os.cpu_count(),
        "load_average_at_start": round(os.getloadavg()[0], 1),
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
        cost(Path(workdir), prepared, args.batch, None)  # the first run warms the file system
        table = cost(Path(workdir), prepared, args.batch, None)
        out["table_alone"] = table
        indexes: dict[str, Any] = {}
        for columns in layout:
            alone = cost(Path(workdir), prepared, args.batch, columns)
            indexes[",".join(columns)] = alone | {
                "cpu_us_above_table": round(alone["cpu_us_per_doc"] - table["cpu_us_per_doc"], 1),
                "wal_kib_above_table": round(
                    alone["wal_kib_per_doc"] - table["wal_kib_per_doc"], 1
                ),
            }
        out["indexes"] = indexes
    out["load_average_at_end"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
