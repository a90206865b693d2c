"""The demo's live stream: a gentle, endless series of random cluster operations, so
that a listing changes from one call to the next while the index follows the cells.

Each operation goes through ``cellsight.cells.operations.Operations`` like ``cellsight ops``:
the cell commits, a notification is published, the indexer indexes it. Refusals by
an instance's state (stopping a stopped server, resizing a locked one) are part of
a live cluster and are only counted.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellsight.cells.mappings import CellRegistry
    from cellsight.cells.operations import Operations

LIVE_PREFIX = "live-"
MAX_LIVE = 20
"""Live-booted servers kept at most; beyond it the stream deletes instead of booting,
so a long-running demo stays the same size."""
POOL = 60
"""Seeded servers the stream picks its targets from."""


@dataclass
class LiveStream:
    ops: Operations
    registry: CellRegistry
    interval: float
    seed: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    done: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    _pool: list[str] = field(default_factory=list)
    _live: list[str] = field(default_factory=list)
    _reserved: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._names = (f"{LIVE_PREFIX}{n}" for n in itertools.count(1))

    def _load_pool(self) -> None:
        from cellsight.cells.database import connect
        from cellsight.cells.reads import iter_instances

        for cell in self.registry.list_cells():
            with connect(self.registry.cell_engine(cell)) as conn:
                rows = iter_instances(conn, batch_size=POOL, include_deleted=False)
                for row in itertools.islice(rows, POOL // 2):
                    name = str(row.get("display_name") or "")
                    target = self._live if name.startswith(LIVE_PREFIX) else self._pool
                    target.append(str(row["uuid"]))

    def actions(self) -> dict[str, Callable[[str], object]]:
        from cellsight.cells.flavors import FLAVORS

        flavors = sorted(n for n in FLAVORS if n.startswith("m1."))
        return {
            "rename": lambda u: self.ops.rename(u, f"renamed-{self._random.randrange(10_000)}"),
            "resize": lambda u: self.ops.resize(u, self._random.choice(flavors)),
            "migrate": lambda u: self.ops.live_migrate(u, None),
            "power_off": self.ops.power_off,
            "power_on": self.ops.power_on,
            "reboot": lambda u: self.ops.reboot(u, hard=False),
        }

    def step(self) -> str:
        """One random operation; returns its name."""
        from cellsight.cells.errors import CellsError
        from cellsight.cells.instances import BootRequest
        from cellsight.cells.reservations import Reservations

        choice = self._random.random()
        try:
            if self._reserved and choice < 0.5:
                # A reservation made earlier becomes a real server (instance.create.*).
                uuid = self._reserved.pop()
                Reservations(self.ops).commit(uuid)
                self._live.append(uuid)
                kind = "commit"
            elif choice < 0.08 and len(self._live) < MAX_LIVE:
                # Capacity held first, the server built a step or two later.
                reserved = Reservations(self.ops).reserve(
                    name=next(self._names), project_id="demo", user_id="alice", flavor="m1.small"
                )
                self._reserved.append(reserved.uuid)
                kind = "reserve"
            elif choice < 0.15 and len(self._live) < MAX_LIVE:
                result = self.ops.boot(
                    BootRequest(
                        display_name=next(self._names),
                        flavor="m1.small",
                        project_id="demo",
                        user_id="alice",
                        tags=["live"],
                    )
                )
                self._live.extend(p.uuid for p in result.instances)
                kind = "boot"
            elif (choice < 0.25 or len(self._live) >= MAX_LIVE) and self._live:
                self.ops.delete(self._live.pop(self._random.randrange(len(self._live))))
                kind = "delete"
            else:
                targets = self._pool + self._live
                if not targets:
                    return "idle"
                kind, action = self._random.choice(sorted(self.actions().items()))
                action(self._random.choice(targets))
        except CellsError as exc:
            self.refused[exc.reason] += 1
            return "refused"
        self.done[kind] += 1
        return kind

    def run(self) -> None:
        self._load_pool()
        while not self.stop.wait(self.interval):
            self.step()
