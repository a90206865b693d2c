"""Instructions a notification for the indexer's per-message work on the embedded engine
(decode, map, tags merge, the versioned bulk write of new instances), this checkout
against another commit, counted by valgrind's callgrind: counts do not drift with the
machine's load, so a small change of the write path is measured where timing cannot.

    .venv/bin/python scripts/bench_write_instructions.py --base <commit> [--count 5000]

Each side runs twice under callgrind, once with ``--warm`` notifications and once with
``--count``, over the same bodies (generated once, before either); the difference per
notification between the two runs leaves out start-up, imports and the first batch.
The base runs from a temporary ``git worktree`` of ``--base``. Prints JSON; needs
valgrind and the Nova samples beside the checkout (``bench/corpus.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

# Run inside valgrind: the checkout given first on sys.path, the bodies from a pickle.
CHILD = """
import pickle, sys, tempfile, pathlib
sys.path.insert(0, sys.argv[1])
import cellsight
assert cellsight.__file__.startswith(sys.argv[1]), cellsight.__file__
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.writer import BatchWriter
bodies = pickle.load(open(sys.argv[2], "rb"))[: int(sys.argv[3])]
engine = EmbeddedEngine(pathlib.Path(tempfile.mkdtemp()) / "index.db")
engine.ensure_ready("instance")
writer = BatchWriter(engine, record_metrics=False)
for start in range(0, len(bodies), 1000):
    writer.write(bodies[start : start + 1000])
engine.close()
"""


def instructions(root: Path, bodies: Path, count: int, work: Path) -> int:
    out = work / f"callgrind.{root.name}.{count}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            CHILD,
            str(root),
            str(bodies),
            str(count),
        ],
        check=True,
        capture_output=True,
        # String hashes seed set and dict orders: the same seed gives the same count.
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    match = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no summary in {out}")
    return int(match.group(1))


def per_notification(root: Path, bodies: Path, warm: int, count: int, work: Path) -> float:
    return (instructions(root, bodies, count, work) - instructions(root, bodies, warm, work)) / (
        count - warm
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--warm", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.count <= args.warm:
        raise SystemExit("--count must be above --warm")
    from bench.corpus import Corpus
    from bench.worktree import worktree

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bodies = Corpus(args.seed).pickle_bodies(args.count, work / "bodies.pickle")
        with worktree(args.base, work / "base") as base:
            result: dict[str, Any] = {
                "benchmark": "write_instructions",
                "count": args.count,
                "warm": args.warm,
                "base": args.base,
                "base_per_notification": per_notification(
                    base, bodies, args.warm, args.count, work
                ),
                "this_per_notification": per_notification(
                    ROOT, bodies, args.warm, args.count, work
                ),
            }
    result["ratio"] = result["this_per_notification"] / result["base_per_notification"]
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
