"""Soak: the whole system under load and injected faults, then an exact check.

For ``--seconds`` (default 600), producers run random cluster operations on 5 cells
(4 SQLite, 1 PostgreSQL behind a TCP proxy) through the transactional outbox; the
indexer (a subprocess, with its periodic outbox relay) consumes from the embedded
Redis bus into the embedded index; clients list and query through the API (a
subprocess). On a schedule: the indexer is SIGKILLed and restarted, the index is made
unavailable (its write lock held), the PostgreSQL cell is cut off and restored, the
embedded bus is restarted (never the machine's shared RabbitMQ), a bulk sync runs,
poison messages are published. Then: the index must equal the cells row by row, every
list response must have been 200 (from the index or the fan-out path), the DLQ must
hold exactly the injected poison, and each process's RSS must stay under the bound.

    python scripts/soak.py --seconds 60 --output soak.json   # exit 0 only if it passed
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.drift

from bench.measure import free_port
from soak_faults import Faults
from soak_load import Load
from soak_parts import (
    Child,
    Proxy,
    RssMonitor,
    answers,
    child_env,
    latency_summary,
    verdict,
)

from cellsight.cells import outbox
from cellsight.cells.database import connect
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.clients import build_bus
from cellsight.indexer.dlq import peek
from cellsight.indexer.engines.base import IndexMissing
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.verify import Verifier
from cellsight.settings import load_settings
from tests.support.drift import Drift, index_differences

ENV = {
    "CELLSIGHT_BATCH_AGE_MS": "100",
    "CELLSIGHT_BUS_VISIBILITY_TIMEOUT": "10",
    "CELLSIGHT_OUTBOX_RELAY_INTERVAL": "2",
    "CELLSIGHT_OUTBOX_LEASE": "10",
    "CELLSIGHT_PUBLISH_TIMEOUT": "3",
    "CELLSIGHT_DB_CONNECT_TIMEOUT": "2",
    "CELLSIGHT_CELL_TIMEOUT": "3",
    "CELLSIGHT_SAFE_CONNECT_COOLDOWN": "2",
    "CELLSIGHT_LOG_LEVEL": "WARNING",
}
POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


class Soak(Load, Faults):
    def __init__(self, seconds: float, data_dir: Path, seed: int) -> None:
        self.seconds, self.data_dir, self.rng = seconds, data_dir, random.Random(seed)
        overrides: dict[str, Any] = {
            k.removeprefix("CELLSIGHT_").lower(): v for k, v in ENV.items()
        }
        self.settings = load_settings(data_dir=data_dir, **overrides)
        self.env = child_env({**ENV, "CELLSIGHT_DATA_DIR": str(data_dir)})
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.faults: list[dict[str, Any]] = []
        self.poison: set[bytes] = set()
        self.latency: dict[str, list[float]] = {"list": [], "query": [], "op": []}
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.pg_db = f"soak_{uuidlib.uuid4().hex[:10]}"
        self.proxy: Proxy | None = None
        self.buses: list[Any] = []

    # Setup -------------------------------------------------------------------
    def cluster(self) -> CellRegistry:
        registry = CellRegistry.from_settings(self.settings)
        urls = [f"sqlite:///{self.data_dir.resolve() / f'cell{i}.db'}" for i in range(1, 5)]
        admin = sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.pg_db}"'))
        admin.dispose()
        self.proxy = Proxy("127.0.0.1", 5432)
        urls.append(f"postgresql+psycopg://postgres@127.0.0.1:{self.proxy.port}/{self.pg_db}")
        for i, url in enumerate(urls, 1):
            cell = registry.add_cell(f"cell{i}", url)
            for h in range(3):
                add_compute_node(
                    registry.cell_engine(cell),
                    f"c{i}-h{h}",
                    vcpus=4096,
                    memory_mb=8_000_000,
                    local_gb=400_000,
                )
        return registry

    def drop_pg(self) -> None:
        admin = sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)'))
        admin.dispose()

    # Faults ------------------------------------------------------------------
    def fault(self, name: str, action: Any) -> None:
        started = time.monotonic()
        detail = action()
        self.faults.append(
            {
                "fault": name,
                "at_s": round(started - self.t0, 1),
                "seconds": round(time.monotonic() - started, 2),
                "detail": detail,
            }
        )

    def schedule(self) -> list[tuple[float, str, Any]]:
        hold = max(3.0, min(20.0, self.seconds * 0.06))
        plan: list[tuple[float, str, Any]] = []
        laps = max(1, int(self.seconds // 300))  # every fault once per 5 minutes
        for lap in range(laps):
            base, span = lap / laps, 1 / laps
            plan += [
                (base + 0.08 * span, "poison", self.inject_poison),
                (base + 0.15 * span, "indexer SIGKILL", self.kill_indexer),
                (base + 0.25 * span, "engine unavailable", lambda: self.engine_outage(hold)),
                (base + 0.38 * span, "cell unreachable", lambda: self.cell_outage(hold)),
                (base + 0.50 * span, "bulk sync", self.bulk_sync),
                (base + 0.60 * span, "bus restart", self.restart_bus),
                (base + 0.70 * span, "poison", self.inject_poison),
                (base + 0.78 * span, "indexer SIGKILL", self.kill_indexer),
            ]
        return [(at * self.seconds, name, action) for at, name, action in plan]

    # Run ---------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.buses.append(build_bus(self.settings))
        registry = self.cluster()
        self.indexer = Child("indexer", ["indexer"], self.env, self.data_dir)
        port = free_port()
        api = Child("api", ["api", "--port", str(port)], self.env, self.data_dir)
        self.start_indexer()
        api.start(lambda text: answers(port))
        rss = RssMonitor(
            lambda: {
                "indexer": self.indexer.pid,
                "api": api.pid,
                "bus": self.buses[-1].server.pid,
                "soak": os.getpid(),
            }
        )
        rss.start()
        threads = [
            threading.Thread(target=self.producer, args=(registry, s), daemon=True)
            for s in range(5)
        ]
        threads += [
            threading.Thread(target=self.client, args=(port, 100 + s), daemon=True)
            for s in range(2)
        ]
        self.t0 = time.monotonic()
        for t in threads:
            t.start()
        for at, name, action in self.schedule():
            if self.stop.wait(max(0.0, self.t0 + at - time.monotonic())):
                break
            self.fault(name, action)
        self.stop.wait(max(0.0, self.t0 + self.seconds - time.monotonic()))
        self.stop.set()
        for t in threads:
            t.join(120)
        load_seconds = time.monotonic() - self.t0
        result = self.settle(registry, load_seconds)
        rss.stop.set()
        result["rss_peak_mb"] = rss.peak
        api.stop()
        self.indexer.stop()
        registry.close()
        if self.proxy is not None:
            self.proxy.close()
        pids = [bus.server.pid for bus in self.buses if bus.server is not None]
        for bus in reversed(self.buses):
            bus.close()
        # The bus closes its server only when no other client is connected; a kombu
        # client of the API thread may still be. The soak's data is throwaway: stop it.
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.drop_pg()
        return result

    def settle(self, registry: CellRegistry, load_seconds: float) -> dict[str, Any]:
        started = time.monotonic()
        engine = EmbeddedEngine(self.settings.index_path)
        diffs: dict[str, Drift] | None = None  # None: no instance index to compare
        waiting = -1
        while time.monotonic() - started < 240:
            waiting = 0
            for cell in registry.list_cells():
                with connect(registry.cell_engine(cell)) as conn:
                    waiting += outbox.pending(conn)
            if waiting == 0:
                diffs = _differences(registry, engine)
                if diffs == {}:
                    break
            time.sleep(1.0)
        # Every message the cells' outboxes sent is indexed: the embedded bus takes a
        # message onto its consumer's landing and records it in one step each, so an
        # indexer SIGKILLed or a server restarted between the two loses nothing (it comes
        # back after the visibility timeout). Then verify --repair must find nothing to do.
        found = diffs or {}
        repaired = 0
        after = diffs
        if waiting == 0 and diffs:
            report = Verifier(engine, registry, "instance", repair=True).run(registry.list_cells())
            repaired = sum(c.repaired for c in report.cells)
            after = _differences(registry, engine)
        instances = engine.count("instance")
        engine.close()
        with self.buses[-1].connection() as conn:
            letters = [
                x.body
                for x in peek(
                    conn,
                    self.settings.dead_letter_exchange,
                    self.settings.dead_letter_queue,
                    10_000,
                )
            ]
        return {
            "load_seconds": round(load_seconds, 1),
            "settle_seconds": round(time.monotonic() - started, 1),
            "outbox_left": waiting,
            "index_checked": diffs is not None and after is not None,
            "index_differences": len(found),
            "index_behind": sum(1 for d in found.values() if d.behind),
            "difference_sample": {u: str(d) for u, d in list(found.items())[:5]},
            "repaired_by_verify": repaired,
            "index_differences_after_verify": len(after or {}),
            "indexer_sigkills": sum(1 for f in self.faults if f["fault"] == "indexer SIGKILL"),
            "bus_restarts": sum(1 for f in self.faults if f["fault"] == "bus restart"),
            "instances": instances,
            "dead_letters": len(letters),
            "dead_letters_unexpected": len([b for b in letters if b not in self.poison]),
            "poison_missing": len(self.poison - set(letters)),
        }


def _differences(registry: CellRegistry, engine: EmbeddedEngine) -> dict[str, Drift] | None:
    try:
        return index_differences(registry, engine)
    except IndexMissing:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rss-limit-mb", type=float, default=512.0)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        soak = Soak(args.seconds, data_dir / "soak", args.seed)
        summary = soak.run()
        ops = {k: v for k, v in soak.counts.items() if k.startswith(("op", "request"))}
        summary.update(
            {
                "seconds": args.seconds,
                "operations": ops,
                "responses": dict(soak.statuses),
                "faults": soak.faults,
                "poison_injected": len(soak.poison),
                "latency": {k: latency_summary(v) for k, v in soak.latency.items()},
                "errors": dict(soak.errors),
            }
        )
        checks = verdict(summary, args.rss_limit_mb)
        summary["verdict"] = {"passed": all(checks.values()), **checks}
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0 if summary["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
