"""Worlds for the API tests: the same small cluster on every dialect, and the
index loaded from it, each behind an app.

A *world* is an API database and ``CELLS`` cells seeded identically (same seed, same
clock), then touched up so the data has what paging must survive: ties on the sort
keys, nulls, duplicate names, locked, deleted and forthcoming instances. Worlds are
module-scoped and read-only: tests that change data build their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.cell_query import row_document
from cellsight.cells.database import Engines, connect
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import iter_instances
from cellsight.cells.schema import instances
from cellsight.cells.seed import seed
from cellsight.indexer.engines.base import SearchEngine, WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.index_roles import marker_key
from cellsight.settings import Settings, load_settings
from tests.support.services import create_database, drop_database

CELLS = 3
PER_CELL = 40
SEED = 11
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
ADMIN = {"X-Auth-Token": "root:admin"}


@dataclass
class World:
    registry: CellRegistry
    dialect: str
    dropped: list[tuple[sa.URL, str]] = field(default_factory=list)

    def rows(self) -> list[tuple[str, dict[str, Any]]]:
        """(cell uuid, row) of every instance."""
        out: list[tuple[str, dict[str, Any]]] = []
        for cell in self.registry.list_cells():
            with connect(self.registry.cell_engine(cell)) as conn:
                out.extend((cell.uuid, row) for row in iter_instances(conn))
        return out

    def listed_server(self) -> str:
        """A server of the first cell that a default listing shows."""
        cell = self.registry.list_cells()[0]
        return next(
            row["uuid"]
            for c, row in self.rows()
            if c == cell.uuid and not row["deleted"] and not row["forthcoming"]
        )

    def set_row(self, uuid: str, **values: Any) -> None:
        """Change an instance row with plain SQL, behind the notifications' back."""
        for cell in self.registry.list_cells():
            with connect(self.registry.cell_engine(cell)) as conn, conn.begin():
                conn.execute(instances.update().where(instances.c.uuid == uuid).values(**values))

    def close(self) -> None:
        self.registry.close()
        for server, name in self.dropped:
            drop_database(server, name)


def touch_up(registry: CellRegistry) -> None:
    """Ties, nulls and rare states, decided by row id so every dialect gets the same."""
    for cell in registry.list_cells():
        engine = registry.cell_engine(cell)
        with engine.begin() as conn:
            c = instances.c
            first = conn.execute(sa.select(c.created_at).where(c.id == 1)).scalar_one()
            tie = conn.execute(sa.select(c.updated_at).where(c.id == 2)).scalar_one()

            def where(mod: int, rest: int = 0) -> sa.ColumnElement[bool]:
                return (instances.c.id % mod) == rest

            conn.execute(instances.update().where(where(5)).values(created_at=first))
            conn.execute(instances.update().where(where(7, 3)).values(updated_at=tie))
            conn.execute(instances.update().where(where(9)).values(display_name=None))
            conn.execute(instances.update().where(where(6, 1)).values(display_name="dup-name"))
            conn.execute(instances.update().where(where(8)).values(updated_at=None))
            conn.execute(instances.update().where(where(4)).values(locked=True))
            conn.execute(
                instances.update()
                .where(where(10, 3))
                .values(
                    task_state="rebooting_hard",
                    vm_state="active",
                    deleted=False,
                    deleted_at=None,
                    terminated_at=None,
                )
            )
            conn.execute(instances.update().where(where(11, 2)).values(power_state="crashed"))
            conn.execute(
                instances.update()
                .where(where(13, 6))
                .values(
                    forthcoming=True,
                    vm_state="building",
                    task_state=None,
                    host=None,
                    node=None,
                    launched_at=None,
                    deleted=False,
                    deleted_at=None,
                )
            )


def build_world(tmp: Path, dialect: str, server: sa.URL | None = None) -> World:
    tmp.mkdir(parents=True, exist_ok=True)
    registry = CellRegistry(f"sqlite:///{tmp / 'api.db'}", Engines(statement_timeout=10.0))
    registry.create_schema()
    world = World(registry, dialect)
    urls: list[str] = []
    if server is not None:
        for _ in range(CELLS):
            name, url = create_database(server, "cs_api")
            world.dropped.append((server, name))
            urls.append(url)
    seed(
        registry,
        cells=CELLS,
        instances_per_cell=PER_CELL,
        cells_dir=tmp / "cells",
        db_urls=urls,
        seed=SEED,
        now=NOW,
        workers=1,
        chunk_size=PER_CELL,
    )
    touch_up(registry)
    return world


def load_index(engine: SearchEngine, world: World) -> None:
    engine.ensure_ready("instance")
    ops = []
    for cell_uuid, row in world.rows():
        stored = row_document(row, cell_uuid)
        ops.append(WriteOp("instance", stored.id, stored.version, stored.document))
    engine.bulk(ops)
    engine.refresh("instance")
    (serving,) = [i.name for i in engine.indexes("instance") if i.read]
    engine.put_meta(marker_key("instance"), {"resource": "instance", "index": serving})


def api_settings(tmp: Path, **overrides: Any) -> Settings:
    return load_settings(data_dir=tmp / "data", **overrides)


AppFactory = Callable[..., FastAPI]


def make_client(
    tmp: Path, world: World, engine: SearchEngine | None = None, **settings: Any
) -> TestClient:
    """An app over ``world``; without ``engine`` an empty, unsynced one (fan-out)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if engine is None:
        engine = EmbeddedEngine(tmp / "empty-index.db", prefix=f"e{uuid.uuid4().hex[:8]}")
    app = create_app(api_settings(tmp, **settings), engine=engine, registry=world.registry)
    return TestClient(app)


def project_tokens(world: World) -> list[dict[str, str]]:
    """A token for each project, biggest first (non-administrators); a reservation not
    yet given a project (a test may have made one) is nobody's."""
    counts: dict[str, int] = {}
    for _, row in world.rows():
        if row["project_id"]:
            counts[row["project_id"]] = counts.get(row["project_id"], 0) + 1
    ordered = sorted(counts, key=lambda p: (-counts[p], p))
    return [{"X-Auth-Token": f"user-{p[:6]}:{p}"} for p in ordered]


def ago(days: int) -> str:
    return (NOW - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def both_paths(world: World, tmp: Path, prefix: str) -> Iterator[dict[str, TestClient]]:
    """``{"index": ..., "fanout": ...}``: the same world behind a loaded embedded index
    and behind none (the fan-out path); closed afterwards."""
    engine = EmbeddedEngine(tmp / "index.db", prefix=prefix)
    load_index(engine, world)
    clients = {
        "index": make_client(tmp / "index", world, engine),
        "fanout": make_client(tmp / "fanout", world),
    }
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()
        engine.close()
