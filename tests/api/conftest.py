"""Shared worlds for the API tests (built by ``tests.support.api_world``): the same small
cluster on every dialect, module-scoped and read-only; tests that change data build their
own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.api_world import (  # noqa: F401  (names kept for older imports)
    ADMIN,
    CELLS,
    NOW,
    PER_CELL,
    SEED,
    AppFactory,
    World,
    ago,
    api_settings,
    build_world,
    load_index,
    make_client,
    project_tokens,
    touch_up,
)
from tests.support.query2_world import instance_documents, make_pair
from tests.support.services import create_database, drop_database  # noqa: F401


@pytest.fixture(scope="module")
def sqlite_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("world-sqlite"), "sqlite")
    yield world
    world.close()


@pytest.fixture(scope="module")
def world(sqlite_world: World) -> World:
    """The query v2 suites' world (modules that need another define their own)."""
    return sqlite_world


@pytest.fixture(scope="module")
def pair(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The same world behind the index path and the fan-out path (query v2 suites)."""
    p = make_pair(tmp_path_factory.mktemp("q2-pair"), world)
    yield p
    p.close()


@pytest.fixture(scope="module")
def docs(world: World) -> list[dict[str, Any]]:
    return instance_documents(world)


@pytest.fixture(scope="module")
def postgres_world(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: sa.URL
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("world-pg"), "postgresql", postgres_server)
    yield world
    world.close()


@pytest.fixture(scope="module")
def mariadb_world(
    tmp_path_factory: pytest.TempPathFactory, mariadb_server: sa.URL
) -> Iterator[World]:
    world = build_world(tmp_path_factory.mktemp("world-maria"), "mariadb", mariadb_server)
    yield world
    world.close()
