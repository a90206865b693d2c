"""The cell engines' compiled-statement caches are bounded small (an adversarial probe:
the fan-out API grew by ~30 MB a cell, to 804 MB over 10 cells and still growing, as
listings of many sort and filter shapes filled SQLAlchemy's default 500-750 entries of
~40 KiB each in every cell's engine)."""

from __future__ import annotations

import itertools

import pytest

from cellsight.api.cell_query import search_cell
from cellsight.cells.database import Engines, connect, create_database
from cellsight.cells.dialects import QUERY_CACHE_SIZE
from cellsight.cells.schema import create_cell_schema
from cellsight.query.tree import Direction, MatchAll, SearchRequest, SortKey, total_order
from tests.support.services import DIALECTS, DatabaseFactory

FIELDS = ["created_at", "updated_at", "display_name", "host", "node", "launched_at", "user_id"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_cells_statement_cache_stays_small_under_many_query_shapes(
    dialect: str, make_database: DatabaseFactory
) -> None:
    engines = Engines(connect_timeout=5)
    try:
        url = make_database(dialect)
        create_database(url)  # a SQLite file (the servers' databases are made)
        engine = engines.get(url)
        create_cell_schema(engine)
        shapes = [
            total_order((SortKey(a, da), SortKey(b, db)))
            for a, b in itertools.permutations(FIELDS, 2)
            for da, db in itertools.product(Direction, Direction)
        ]
        assert len(shapes) > 2 * QUERY_CACHE_SIZE  # enough to fill the default cache
        with connect(engine) as conn:
            for order in shapes:
                assert search_cell(conn, SearchRequest(MatchAll(), order, 5)) == []
            # The last shape again: cached, as the shapes a cluster's clients repeat are.
            assert search_cell(conn, SearchRequest(MatchAll(), shapes[-1], 5)) == []
        assert engine._compiled_cache is not None
        assert engine._compiled_cache is not None
        held = len(engine._compiled_cache)  # SQLAlchemy's LRU: pruned past 1.5 x its size
        assert 0 < held <= QUERY_CACHE_SIZE * 3 // 2
    finally:
        engines.dispose()
