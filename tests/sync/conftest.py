"""Bulk sync and anti-entropy fixtures: cells on every dialect, every engine, a producer.

``world`` is a registry (API database on SQLite) with cells on the ``dialect`` under
test, seeded with instances and compute nodes, and the ``engine_kind`` under test; see
``tests.support.sync_world``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.database import Engines
from cellsight.cells.mappings import CellRegistry
from tests.support.services import DIALECTS, DatabaseFactory
from tests.support.services import osmem_clone_url as osmem_url  # noqa: F401  (older name)
from tests.support.sync_world import (  # noqa: F401  (names kept for older imports)
    IndexingPublisher,
    World,
    make_engine,
)

ENGINES = ["embedded", pytest.param("opensearch", marks=pytest.mark.services)]


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=ENGINES)
def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_world(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[Any]:
    """``make_world(dialect, engine_kind, cells=2, instances=30)``."""
    made: list[World] = []

    def make(dialect: str, kind: str, cells: int = 2, instances: int = 30) -> World:
        registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}", Engines(connect_timeout=5))
        registry.create_schema()
        world = World(
            registry,
            make_engine(request, kind, tmp_path / "index.db"),
            dialect,
            make_url=lambda: make_database(dialect),
            cells_dir=tmp_path / "cells",
        )
        made.append(world)
        world.add_cells(cells, instances)
        return world

    yield make
    for world in made:
        world.engine.close()
        world.registry.close()


@pytest.fixture
def world(make_world: Any, dialect: str, engine_kind: str) -> World:
    made: World = make_world(dialect, engine_kind)
    return made
