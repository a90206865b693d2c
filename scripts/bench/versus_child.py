"""One side of ``bench_versus.py``, in a fresh interpreter:

    python scripts/bench/versus_child.py ROOT BODIES BATCH engine|floor

``engine``: ROOT's own ``plan`` and ``engine.bulk`` of every body, in batches, into an
empty index. ``floor`` (this checkout's code only): the same documents' rows, built
before the clock, through the SQL alone (``bench.floor.FloorWriter``). The package
layout moved under ``cellsight`` after issue 11 was filed (``cellsight`` held only the
settings and the CLI before): both layouts are accepted, and every module must come from
ROOT. Both modes run under the writer process's collector policy (the bodies frozen,
automatic collection off, a young-generation pass timed after each write). Prints one
JSON line: documents, written, and the write's wall and CPU seconds and the planning's
CPU seconds.
"""

from __future__ import annotations

import gc
import json
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load(root: str) -> tuple[Any, Any, Any]:
    """ROOT's EmbeddedEngine, the status of a write it took, and its writer module."""
    sys.path.insert(0, root)
    # An editable install of this checkout answers for "cellsight.*" before sys.path does.
    sys.meta_path[:] = [
        f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable")
    ]
    try:
        from cellsight.indexer import writer
        from cellsight.indexer.engines.base import WriteStatus
        from cellsight.indexer.engines.embedded import EmbeddedEngine
    except ImportError:
        for name in [m for m in sys.modules if m == "cellsight" or m.startswith("cellsight.")]:
            del sys.modules[name]
        from indexer import writer  # type: ignore[no-redef]
        from indexer.engines.base import WriteStatus  # type: ignore[assignment]
        from indexer.engines.embedded import EmbeddedEngine  # type: ignore[assignment]
    if not str(writer.__file__).startswith(root):
        raise SystemExit(f"{writer.__file__} is not from {root}")
    return EmbeddedEngine, WriteStatus.OK, writer


def measure(
    writer: Any,
    bodies: list[bytes],
    batch: int,
    prepare: Callable[[list[Any]], Any],
    write: Callable[[Any], Any],
    count: Callable[[Any], int],
) -> dict[str, Any]:
    """Plan each batch (timed), make its items (``prepare``, untimed), then ``write``
    them (timed, with the collector's pass after it); ``count`` says how many it took."""
    gc.collect()
    gc.freeze()
    gc.disable()
    plan_cpu = wall = cpu = 0.0
    written = 0
    for start in range(0, len(bodies), batch):
        c = time.thread_time()
        _, planned = writer.plan(bodies[start : start + batch])
        plan_cpu += time.thread_time() - c
        writer.merge_tags(planned, {})  # what the indexer stores for new tag-less payloads
        items = prepare([p.op for p in planned])
        del planned
        gc.collect(0)
        t, c = time.perf_counter(), time.thread_time()
        done = write(items)
        gc.collect(0)
        wall += time.perf_counter() - t
        cpu += time.thread_time() - c
        written += count(done)
    return {"docs": len(bodies), "written": written, "wall": wall, "cpu": cpu, "plan_cpu": plan_cpu}


def main() -> None:
    root, bodies_path, batch, mode = sys.argv[1:5]
    engine_class, taken, writer = load(root)
    bodies = pickle.loads(Path(bodies_path).read_bytes())
    with tempfile.TemporaryDirectory() as where:
        if mode == "floor":
            sys.path.insert(1, str(Path(root) / "scripts"))
            from bench.floor import FloorWriter

            floor = FloorWriter(Path(where) / "floor.db")
            figures = measure(writer, bodies, int(batch), floor.prepare, floor.write, int)
            floor.close()
        else:
            engine = engine_class(Path(where) / "index.db", prefix="versus")
            engine.ensure_ready("instance")

            def count(results: list[Any]) -> int:
                return sum(r.status is taken for r in results)

            figures = measure(writer, bodies, int(batch), list, engine.bulk, count)
            engine.close()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
