"""Every search path, loaded once per session with the same instances.

``paths`` maps a name to a function from a ``SearchRequest`` to result documents:
the cells' ``instances`` table on SQLite, PostgreSQL and MariaDB (rows written by the
cells' own ``payload_to_row``), the embedded engine (also bulk loaded and analyzed,
walking the sort index: ``embedded-walk`` and, cut at once, ``embedded-walk-cut``), and
osmem through both HTTP clients (each loading its own index through ``bulk``). A
missing server skips, or fails under ``CELLSIGHT_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.api.cell_query import search_cell
from cellsight.cells.database import create_database as create_cell_database
from cellsight.cells.database import create_engine
from cellsight.cells.rows import payload_to_row
from cellsight.cells.schema import create_cell_schema, instances
from cellsight.indexer.engines import sqlite_search
from cellsight.indexer.engines.base import SearchEngine, StoredDocument, WriteOp, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.sqlite_schema import order_index
from cellsight.query.sqlite_regexp import install_on_engine
from cellsight.query.tree import SearchRequest
from tests.support import query_dataset as data
from tests.support.services import (
    create_database,
    drop_database,
    osmem_clone_url,
    server_fixture,
)

Search = Callable[[SearchRequest], list[StoredDocument]]


@pytest.fixture(scope="session")
def query_payloads() -> list[Any]:
    return data.payloads()


@pytest.fixture(scope="session")
def query_documents(query_payloads: list[Any]) -> list[dict[str, Any]]:
    return data.documents(query_payloads)


def _cell(url: str, payloads: list[Any]) -> sa.Engine:
    create_cell_database(url)  # engines open existing SQLite files only
    engine = create_engine(url)
    install_on_engine(engine)
    create_cell_schema(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(instances), [payload_to_row(p) for p in payloads])
    return engine


def _load(engine: SearchEngine, documents: list[dict[str, Any]]) -> SearchEngine:
    engine.ensure_ready("instance")
    ops = [WriteOp("instance", d["uuid"], d["version"], d) for d in documents]
    results = engine.bulk(ops)
    assert all(r.status is WriteStatus.OK for r in results), results
    engine.refresh("instance")
    return engine


def _cell_search(engine: sa.Engine) -> Search:
    def search(request: SearchRequest) -> list[StoredDocument]:
        with engine.connect() as conn:
            return search_cell(conn, request, cell_uuid=data.CELL_UUID)

    return search


@pytest.fixture(scope="session")
def query_cells(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    query_payloads: list[Any],
) -> Iterator[dict[str, sa.Engine]]:
    """The cell database of every dialect, holding the data set."""
    root: Path = tmp_path_factory.mktemp("query-cells")
    cells = {"sqlite": _cell(f"sqlite:///{root / 'cell.db'}", query_payloads)}
    created: list[tuple[sa.URL, str]] = []
    for dialect in ("postgresql", "mariadb"):
        server: sa.URL = request.getfixturevalue(server_fixture(dialect))
        name, url = create_database(server, "cs_q")
        created.append((server, name))
        cells[dialect] = _cell(url, query_payloads)
    yield cells
    for engine in cells.values():
        engine.dispose()
    for server, name in created:
        drop_database(server, name)


@pytest.fixture(scope="session")
def query_engines(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    query_documents: list[dict[str, Any]],
) -> Iterator[dict[str, SearchEngine]]:
    """The embedded engine and osmem through both HTTP clients, holding the data set."""
    from cellsight.indexer.engines.elasticsearch import ElasticsearchEngine
    from cellsight.indexer.engines.opensearch import OpenSearchEngine
    from tests.support.es_compat import ES_CLIENT_OPTIONS

    root: Path = tmp_path_factory.mktemp("query-index")
    engines: list[SearchEngine] = [EmbeddedEngine(root / "index.db", prefix="q")]
    osmem = osmem_clone_url(request)
    engines.append(OpenSearchEngine(osmem, prefix="qos", timeout=30.0))
    engines.append(ElasticsearchEngine(osmem, prefix="qes", timeout=30.0, **ES_CLIENT_OPTIONS))
    for engine in engines:
        _load(engine, query_documents)
    yield {engine.distribution: engine for engine in engines}
    for engine in engines:
        engine.close()


@pytest.fixture(scope="session")
def analyzed_engine(
    tmp_path_factory: pytest.TempPathFactory, query_documents: list[dict[str, Any]]
) -> Iterator[EmbeddedEngine]:
    """The embedded engine loaded as bulk sync loads it: indexes built and analyzed
    afterwards, so its searches have the statistics that decide an ordered walk."""
    engine = EmbeddedEngine(tmp_path_factory.mktemp("query-analyzed") / "index.db", prefix="qa")
    name = engine.new_index_name("instance")
    engine.create_index("instance", name, bulk_load=True)
    ops = (WriteOp("instance", d["uuid"], d["version"], d) for d in query_documents)
    assert all(r.status is WriteStatus.OK for r in engine.bulk_index(name, ops))
    engine.finish_bulk_load(name)
    engine.set_aliases("instance", read=name, write=[name])
    yield engine
    engine.close()


def _walking(engine: SearchEngine, budget: float) -> Search:
    """Searches that walk the index leading with the first sort key whenever there is
    one (``sqlite_search._walk_index`` walks only when the plan would sort many rows),
    cut after ``budget`` seconds (0: mostly the planner's plan after an interrupted walk).
    The walk must return the same rows as the planner's plan for any filter and keyset."""

    def walk_index(
        conn: Any, schema: Any, index: str, sql: str, params: Any, order: Any, limit: int
    ) -> str | None:
        return order_index(schema.resource, index, order[0].field) if order else None

    def search(request: SearchRequest) -> list[StoredDocument]:
        saved = sqlite_search._walk_index, sqlite_search.WALK_BUDGET_S
        sqlite_search._walk_index, sqlite_search.WALK_BUDGET_S = walk_index, budget
        try:
            return engine.search("instance", request)
        finally:
            sqlite_search._walk_index, sqlite_search.WALK_BUDGET_S = saved

    return search


@pytest.fixture(scope="session")
def paths(
    query_cells: dict[str, sa.Engine],
    query_engines: dict[str, SearchEngine],
    analyzed_engine: EmbeddedEngine,
) -> dict[str, Search]:
    out: dict[str, Search] = {f"cell-{d}": _cell_search(e) for d, e in query_cells.items()}
    for name, engine in query_engines.items():

        def engine_search(req: SearchRequest, e: SearchEngine = engine) -> list[StoredDocument]:
            return e.search("instance", req)

        out[name] = engine_search
    out["embedded-walk"] = _walking(analyzed_engine, math.inf)
    out["embedded-walk-cut"] = _walking(analyzed_engine, 0.0)
    return out
