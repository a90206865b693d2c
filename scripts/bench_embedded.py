"""Embedded engine write throughput: bulk sync load and live bulk writes.

    .venv/bin/python scripts/bench_embedded.py [--docs 200000] [--dir /tmp]

Documents are the Nova ``instance.create.end`` sample varied per instance (uuid, names,
project, cell, timestamps, tags, addresses), built before the clock starts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from indexer.documents import event_version, instance_document
from indexer.engines.base import WriteOp, WriteStatus
from indexer.engines.embedded import EmbeddedEngine
from indexer.engines.sqlite_rows import encode_json
from notifications.base import format_timestamp
from notifications.envelope import decode
from notifications.payloads import InstancePayload

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "nova-notification-samples"
SAMPLE = SAMPLES / "instance-create-end.json"


def build(count: int) -> list[WriteOp]:
    n = decode(json.loads(SAMPLE.read_text()))
    assert isinstance(n.payload, InstancePayload)
    base = instance_document(n.payload, n.event_type, event_version(n.payload, n.event, None))
    start = datetime(2024, 1, 1, tzinfo=UTC)
    cells = [str(uuid.UUID(int=c + 1)) for c in range(8)]
    ops = []
    for i in range(count):
        doc: dict[str, Any] = dict(base)
        doc_id = str(uuid.UUID(int=(i * 2654435761) % (1 << 128)))
        created = start + timedelta(seconds=i, microseconds=(i * 7919) % 1_000_000 if i % 3 else 0)
        doc.update(
            uuid=doc_id,
            display_name=f"server-{i}",
            tenant_id=f"project-{i % 500}",
            user_id=f"user-{i % 2000}",
            host=f"compute-{i % 300}",
            cell_uuid=cells[i % len(cells)],
            created_at=format_timestamp(created),
            launched_at=format_timestamp(created + timedelta(seconds=30)),
            updated_at=format_timestamp(created + timedelta(seconds=31)),
            tags=[f"tag-{i % 50}"],
            ip4=[f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"],
            version=1000 + i,
        )
        ops.append(WriteOp("instance", doc_id, 1000 + i, doc))
    return ops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000, help="live bulk() batch size")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    ops = build(args.docs)
    # A real sync streams its documents; pre-built ones would make every garbage
    # collection walk all of them, which is the benchmark's cost, not the engine's.
    gc.freeze()
    print(
        f"{args.docs:,} documents, JSON encoder: {encode_json.__name__}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    workdir = Path(tempfile.mkdtemp(dir=args.dir))

    engine = EmbeddedEngine(workdir / "sync.db", prefix="bench")
    engine.create_index("instance", "bench-instance-sync", bulk_load=True)
    t0 = time.perf_counter()
    results = list(engine.bulk_index("bench-instance-sync", iter(ops), chunk_size=2000))
    t1 = time.perf_counter()
    engine.finish_bulk_load("bench-instance-sync")
    t2 = time.perf_counter()
    assert all(r.status is WriteStatus.OK for r in results), results[:3]
    print(
        f"bulk_index (bulk load): {len(ops) / (t1 - t0):,.0f} docs/s ({t1 - t0:.2f} s), "
        f"finish_bulk_load {t2 - t1:.2f} s; with finish {len(ops) / (t2 - t0):,.0f} docs/s"
    )

    live = EmbeddedEngine(workdir / "live.db", prefix="bench")
    live.ensure_ready("instance")
    t0 = time.perf_counter()
    for k in range(0, len(ops), args.batch):
        live.bulk(ops[k : k + args.batch])
    t1 = time.perf_counter()
    print(f"bulk (live, indexed, batches of {args.batch}): {len(ops) / (t1 - t0):,.0f} docs/s")
    t0 = time.perf_counter()
    for k in range(0, len(ops), args.batch):
        live.bulk(ops[k : k + args.batch])
    t1 = time.perf_counter()
    print(f"bulk (live, all duplicates → stale): {len(ops) / (t1 - t0):,.0f} docs/s")
    size = sum(p.stat().st_size for p in workdir.iterdir()) / 2**20
    print(f"files: {size:,.0f} MiB")
    engine.close()
    live.close()
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
