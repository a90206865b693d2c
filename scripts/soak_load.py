"""The load the soak (``scripts/soak.py``) runs: producers of cluster operations and API
clients, as a mixin of its ``Soak``."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

from cellsight.cells.errors import CellsError
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox
from cellsight.clients import build_notifier
from cellsight.settings import Settings

ADMIN = {"X-Auth-Token": "soak:admin", "Content-Type": "application/json"}


class Load:
    stop: threading.Event
    settings: Settings
    lock: threading.Lock
    counts: Counter[str]
    latency: dict[str, list[float]]
    statuses: Counter[str]
    errors: Counter[str]

    def producer(self, registry: CellRegistry, seed: int) -> None:
        rng = random.Random(seed)
        with build_notifier(self.settings) as notifier:
            ops = Operations(
                registry,
                notifier,
                publisher_id=f"soak-{seed}",
                relay=Outbox(notifier, lease_seconds=10),
            )
            mine: list[str] = []
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    kind = self.step(ops, rng, mine)
                    self.count(f"op.{kind}", time.perf_counter() - started)
                except CellsError as exc:  # a precondition or an unreachable cell
                    self.count(f"op_refused.{type(exc).__name__}")
                except Exception as exc:
                    with self.lock:
                        self.errors[f"producer {type(exc).__name__}: {exc}"[:200]] += 1
                self.stop.wait(0.02)

    def step(self, ops: Operations, rng: random.Random, mine: list[str]) -> str:
        if len(mine) < 5 or rng.random() < 0.15:
            made = ops.boot(
                BootRequest(
                    f"vm{rng.randrange(10_000)}",
                    "m1.small",
                    rng.choice(["p1", "p2", "p3"]),
                    "u",
                    count=rng.randint(1, 3),
                    cell=f"cell{rng.randint(1, 5)}",
                )
            )
            mine += [p.uuid for p in made.instances]
            return "boot"
        vm = rng.choice(mine)
        kind, action = rng.choice(
            [
                ("rename", lambda: ops.rename(vm, f"n{rng.randrange(10_000)}")),
                ("power_off", lambda: ops.power_off(vm)),
                ("power_on", lambda: ops.power_on(vm)),
                ("tags", lambda: ops.set_tags(vm, rng.sample(["a", "b", "c", "d"], 2))),
                ("resize", lambda: ops.resize(vm, rng.choice(["m1.small", "m1.large"]))),
                ("delete", lambda: ops.delete(vm)),
            ]
        )
        action()
        return str(kind)

    def client(self, port: int, seed: int) -> None:
        rng = random.Random(seed)
        base = f"http://127.0.0.1:{port}"
        while not self.stop.is_set():
            if rng.random() < 0.7:
                sort = rng.choice(["display_name", "created_at", "uuid"])
                req = urllib.request.Request(
                    f"{base}/v2.1/servers/detail?all_tenants=1&limit=50&sort_key={sort}",
                    headers=ADMIN,
                )
                what = "list"
            else:
                body = {"fields": ["uuid", "name", "status"], "filter": ["=~", "name", "^n1"]}
                req = urllib.request.Request(
                    f"{base}/v2.1/query/instance",
                    headers=ADMIN,
                    data=json.dumps(body).encode(),
                    method="POST",
                )
                what = "query"
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=60) as response:
                    response.read()
                    status, path = response.status, response.headers.get("X-Cellsight-Path")
            except urllib.error.HTTPError as exc:
                status, path = exc.code, exc.headers.get("X-Cellsight-Path")
            except OSError as exc:
                status, path = 0, type(exc).__name__
            self.count(f"request.{what}", time.perf_counter() - started, latency=what)
            with self.lock:
                self.statuses[f"{what} {status} {path}"] += 1
            self.stop.wait(0.05)

    def count(self, key: str, seconds: float | None = None, latency: str = "op") -> None:
        with self.lock:
            self.counts[key] += 1
            if seconds is not None:
                self.latency[latency].append(seconds)
