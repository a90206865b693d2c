"""Fixtures of the cell contract suite: registry and cell per dialect, a collecting publisher."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from cellsight.cells.database import Engines
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from tests.support.publishers import CollectingPublisher
from tests.support.services import DIALECTS, DatabaseFactory


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def registry(make_database: DatabaseFactory, dialect: str) -> Iterator[CellRegistry]:
    registry = CellRegistry(make_database(dialect), Engines(connect_timeout=5))
    registry.create_schema()
    yield registry
    # Before the databases are dropped: no pooled connection may hold them.
    registry.close()


@pytest.fixture
def add_cell(
    registry: CellRegistry, make_database: DatabaseFactory, dialect: str
) -> Callable[..., CellMapping]:
    def add(
        name: str, hosts: Sequence[str] = ("host1", "host2", "host3"), **node: Any
    ) -> CellMapping:
        cell = registry.add_cell(name, make_database(dialect))
        engine = registry.cell_engine(cell)
        for host in hosts:
            add_compute_node(engine, host, availability_zone="az1", **node)
        return cell

    return add


@pytest.fixture
def cell(add_cell: Callable[..., CellMapping]) -> CellMapping:
    return add_cell("cell1")


@pytest.fixture
def publisher() -> CollectingPublisher:
    return CollectingPublisher()


@pytest.fixture
def ops(registry: CellRegistry, cell: CellMapping, publisher: CollectingPublisher) -> Operations:
    return Operations(registry, publisher, publisher_id="cellsight-test")
