"""The first write after an upgrade: an embedded index of the earlier secondary-index
layout brought to this one (``Catalog.update_indexes``), as the indexer's first batch
does it.

    .venv/bin/python scripts/bench_upgrade.py [--docs 500000] [--rounds 2] [--dir /tmp]

Builds an index of ``--docs`` new instances (``bench_embedded.build``) with this
version's layout, analyzes it as a sync leaves it, then swaps its secondary indexes for
the earlier layout's (``tests/support/layouts.py``), analyzed again. Each round copies
that file and, in a process of its own, writes one batch of 1,000 new instances through
``engine.bulk``: its wall time, and how far the process's peak RSS rose over it (the
peak is reset just before). The same batch into the copy once migrated is the baseline.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_schema import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_embedded import build

from tests.support.layouts import use_earlier_layout


def prepare(path: Path, docs: int) -> str:
    engine = EmbeddedEngine(path, prefix="bench")
    engine.ensure_ready("instance")
    ops = build(docs)
    for k in range(0, len(ops), 5000):
        engine.bulk(ops[k : k + 5000])
    (info,) = engine.indexes("instance")
    index = info.name
    conn = engine._conn()
    use_earlier_layout(conn, index)
    conn.execute("PRAGMA analysis_limit = 0")
    conn.execute(f"ANALYZE {quote(index)}")
    engine.close()
    return index


def peak_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def first_write(path: str, seed: int) -> dict[str, Any]:
    """In the child: one batch through a fresh engine, timed, with its peak RSS."""
    ops = build(1000, seed=seed)
    engine = EmbeddedEngine(path, prefix="bench")
    engine.get("instance", "warm-up")  # the connection and its pragmas, untimed
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak to the current RSS
    before = peak_kb()
    started = time.perf_counter()
    results = engine.bulk(ops)
    seconds = time.perf_counter() - started
    engine.close()
    assert all(r.status.value == "ok" for r in results), results[:3]
    return {"seconds": round(seconds, 3), "peak_rss_rise_mb": round((peak_kb() - before) / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(first_write(args.child, args.seed)))
        return
    out: dict[str, Any] = {"docs": args.docs, "batch": 1000}
    with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
        built = Path(workdir) / "earlier.db"
        out["index"] = prepare(built, args.docs)

        def child(path: Path, seed: int) -> dict[str, Any]:
            command = [sys.executable, __file__, "--child", str(path), "--seed", str(seed)]
            done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
            figures: dict[str, Any] = json.loads(done.stdout)
            return figures

        rounds = []
        for _ in range(args.rounds):
            copy = Path(workdir) / "copy.db"
            shutil.copyfile(built, copy)
            upgrade = child(copy, 7)
            rounds.append({"upgrade": upgrade, "after_upgrade": child(copy, 8)})
            for leftover in Path(workdir).glob("copy.db*"):
                leftover.unlink()
        out["rounds"] = rounds
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
