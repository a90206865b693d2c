"""The faults the soak (``scripts/soak.py``) injects, as a mixin of its ``Soak``."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import uuid as uuidlib
from collections import Counter
from pathlib import Path
from typing import Any

from soak_parts import Child, Proxy, wait_gone

from cellsight.clients import build_bus
from cellsight.notifications import queues
from cellsight.notifications.confirm import ConfirmingProducer, publish_confirmed
from cellsight.settings import Settings


class Faults:
    stop: threading.Event
    settings: Settings
    env: dict[str, str]
    data_dir: Path
    proxy: Proxy | None
    buses: list[Any]
    poison: set[bytes]
    errors: Counter[str]
    indexer: Child

    def start_indexer(self) -> None:
        self.indexer.start(lambda text: "indexer:" in text)

    def kill_indexer(self) -> str:
        pid = self.indexer.pid
        self.indexer.kill()
        self.start_indexer()
        return f"SIGKILL pid {pid}, restarted as {self.indexer.pid}"

    def engine_outage(self, hold: float) -> str:
        db = sqlite3.connect(self.settings.index_path, timeout=30, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")  # every index writer now times out: EngineUnavailable
        self.stop.wait(hold)
        db.execute("ROLLBACK")
        db.close()
        return f"index write lock held {hold:.0f}s"

    def cell_outage(self, hold: float) -> str:
        assert self.proxy is not None
        self.proxy.cut()
        self.stop.wait(hold)
        self.proxy.restore()
        return f"cell5 (PostgreSQL) unreachable {hold:.0f}s"

    def restart_bus(self) -> str:
        server = self.buses[-1].server
        pid = server.pid if server is not None else None
        if pid is None:
            return "not embedded"
        os.kill(pid, signal.SIGTERM)  # redis saves on SIGTERM; the AOF already has it all
        wait_gone(pid)
        self.buses.append(build_bus(self.settings))
        return f"redis-server pid {pid} stopped, restarted as {self.buses[-1].server.pid}"

    def bulk_sync(self) -> str:
        sync = Child("sync", ["index", "sync"], self.env, self.data_dir)
        sync.start(lambda text: True)
        assert sync.proc is not None
        code = sync.proc.wait(300)
        sync.stop()
        if code != 0:
            self.errors[f"bulk sync exit {code}"] += 1
        return f"index sync exit {code}"

    def inject_poison(self) -> str:
        body = f'{{"poison": {len(self.poison)}, "id": "{uuidlib.uuid4()}"}}'.encode()
        with self.buses[-1].connection() as conn:
            # Confirmed: on Redis a plain publish to an exchange this process never
            # declared is routed as "direct" and silently dropped.
            publish_confirmed(
                ConfirmingProducer(conn.channel()),
                body,
                exchange=queues.notifications_exchange(self.settings.exchange),
                routing_key="versioned_notifications.info",
                timeout=10,
                content_type="application/json",
                content_encoding="binary",
            )
        self.poison.add(body)
        return "1 poison message"
