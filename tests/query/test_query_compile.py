"""What the compilers emit, for the choices that are easy to undo by accident: null
placement, code-point collations, .raw sub-fields, date precision, keysets as queries,
and the canonical tree ``prepare`` hands every compiler."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from cellsight.api.cell_query import select_instances
from cellsight.indexer.engines.base import EngineUnavailable, WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.fields import field_map, search_mapping
from cellsight.query.dsl import search_body
from cellsight.query.prepare import QueryError, prepare
from cellsight.query.tree import (
    And,
    Compare,
    Contains,
    Direction,
    Exists,
    MatchAll,
    MatchNone,
    Not,
    Op,
    Or,
    Regex,
    SearchRequest,
    SortKey,
    after,
)
from tests.support import query_dataset as data

INSTANCE = field_map("instance")

DIALECTS = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.dialect(),
    "mariadb": mysql.dialect(),
}


def sql(request: SearchRequest, dialect: str, cell_uuid: str | None = None) -> str:
    query = select_instances(request, dialect, cell_uuid=cell_uuid)
    return str(query.compile(dialect=DIALECTS[dialect]))


def test_mapping_keeps_microseconds_and_long_keywords() -> None:
    props = search_mapping("instance")["properties"]
    assert props["created_at"] == {"type": "date_nanos"}
    assert props["host"]["ignore_above"] == 8191
    assert props["display_name"]["fields"]["raw"]["ignore_above"] == 8191


def test_dsl_sorts_nulls_first_ascending_last_descending_on_raw_fields() -> None:
    order = (SortKey("display_name"), SortKey("launched_at", Direction.DESC))
    body = search_body(SearchRequest(MatchAll(), order, 5), INSTANCE)
    assert body["sort"] == [
        {"display_name.raw": {"order": "asc", "missing": "_first"}},
        {"launched_at": {"order": "desc", "missing": "_last"}},
        {"uuid": {"order": "asc", "missing": "_first"}},
    ]
    assert body["size"] == 5 and body["version"] is True


def test_dsl_keyset_is_a_query_with_full_precision_dates() -> None:
    at = datetime(2024, 3, 1, 12, 0, 0, 1, tzinfo=UTC)
    order = (SortKey("created_at"), SortKey("uuid"))
    body = search_body(SearchRequest(MatchAll(), order, 5, after=(at, "u")), INSTANCE)
    assert "search_after" not in body
    assert '{"range": {"created_at": {"gt": "2024-03-01T12:00:00.000001Z"}}}' in json.dumps(body)


def test_dsl_not_equal_is_some_value_below_or_above() -> None:
    body = search_body(SearchRequest(Compare("tags", Op.NE, "prod"), (), 1), INSTANCE)
    assert body["query"] == {
        "bool": {
            "should": [{"range": {"tags": {"lt": "prod"}}}, {"range": {"tags": {"gt": "prod"}}}],
            "minimum_should_match": 1,
        }
    }


@pytest.mark.parametrize(
    ("op", "at", "query"),
    [
        (Op.GT, datetime(1960, 1, 1, tzinfo=UTC), {"exists": {"field": "launched_at"}}),
        (Op.LT, datetime(1960, 1, 1, tzinfo=UTC), {"match_none": {}}),
        (Op.EQ, datetime(2300, 1, 1, tzinfo=UTC), {"match_none": {}}),
        (Op.LE, datetime(2300, 1, 1, tzinfo=UTC), {"exists": {"field": "launched_at"}}),
        (Op.NE, datetime(1960, 1, 1, tzinfo=UTC), {"exists": {"field": "launched_at"}}),
    ],
)
def test_dsl_decides_bounds_date_nanos_cannot_hold(op: Op, at: datetime, query: Any) -> None:
    body = search_body(SearchRequest(Compare("launched_at", op, at), (), 1), INSTANCE)
    assert body["query"] == query


def test_dsl_regex_is_anchored_and_literal() -> None:
    body = search_body(SearchRequest(Regex("host_name", "a@b"), (), 1), INSTANCE)
    assert body["query"] == {"regexp": {"host_name.raw": {"value": ".*(a\\@b).*", "flags": "NONE"}}}


def test_sql_null_placement_per_dialect() -> None:
    request = SearchRequest(
        MatchAll(), (SortKey("host"), SortKey("launched_at", Direction.DESC)), 3
    )
    assert "instances.host IS NULL DESC, CAST(instances.host AS BINARY) ASC" in sql(
        request, "mariadb"
    )
    assert "instances.launched_at IS NULL ASC, instances.launched_at DESC" in sql(
        request, "mariadb"
    )
    # host is declared COLLATE "C" already: left bare so its index can order
    assert "instances.host ASC NULLS FIRST" in sql(request, "postgresql")
    assert 'display_description COLLATE "C"' in sql(
        SearchRequest(MatchAll(), (SortKey("display_description"),), 1), "postgresql"
    )
    # uuids cannot end in padding: MariaDB's own order is code-point order for them
    assert "ORDER BY instances.uuid ASC" in sql(SearchRequest(MatchAll(), (), 1), "mariadb")
    assert "instances.launched_at DESC NULLS LAST" in sql(request, "sqlite")


def test_sql_negation_is_two_valued() -> None:
    request = SearchRequest(Not(Compare("host", Op.EQ, "h")), (), 1)
    assert "WHERE instances.host IS NULL OR instances.host != ?" in sql(request, "sqlite")


def test_cell_uuid_is_decided_per_cell() -> None:
    request = SearchRequest(Compare("cell_uuid", Op.EQ, "c1"), (SortKey("cell_uuid"),), 1)
    assert "WHERE 1 = 1 ORDER BY instances.uuid ASC" in sql(request, "sqlite", cell_uuid="c1")
    assert "WHERE true ORDER BY" in sql(request, "postgresql", cell_uuid="c1")
    assert "ORDER BY instances.uuid" in sql(request, "sqlite", cell_uuid="c1")
    assert "0 = 1" in sql(request, "sqlite", cell_uuid="c2")


def test_index_only_fields_are_refused_on_the_cells() -> None:
    with pytest.raises(QueryError, match="only known to the index"):
        sql(SearchRequest(Exists("indexed_at"), (), 1), "sqlite")


@pytest.mark.parametrize(
    ("node", "canonical"),
    [
        (Compare("deleted", Op.LT, True), Compare("deleted", Op.EQ, False)),
        (Compare("locked", Op.GT, True), MatchNone()),
        (Compare("locked", Op.GE, False), Exists("locked")),
        (Compare("host", Op.LT, ""), MatchNone()),
        (Compare("host", Op.GE, ""), Exists("host")),
        (Compare("host", Op.NE, ""), Compare("host", Op.GT, "")),
        (
            Compare("created_at", Op.EQ, "2024-03-01T12:00:00Z"),
            Compare("created_at", Op.EQ, datetime(2024, 3, 1, 12, tzinfo=UTC)),
        ),
        (Not(MatchAll()), MatchNone()),
    ],
)
def test_prepare_canonical_forms(node: Any, canonical: Any) -> None:
    assert prepare(SearchRequest(node, (), 1), INSTANCE)[0] == canonical


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (SearchRequest(Compare("progress", Op.EQ, 2.5), (), 1), "cannot take"),
        (SearchRequest(Compare("host", Op.EQ, "a\x00"), (), 1), "NUL"),
        (SearchRequest(Compare("progress", Op.LT, 2**64), (), 1), "64-bit"),
        (SearchRequest(Exists("metadata"), (), 1), "object"),
        (SearchRequest(Regex("progress", "1"), (), 1), "not a string"),
        (SearchRequest(MatchAll(), (), 0), "limit"),
    ],
)
def test_prepare_refuses_what_no_path_could_answer(request_: SearchRequest, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        prepare(request_, INSTANCE)


def test_embedded_search_past_its_deadline_is_unavailable(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="d")
    engine.ensure_ready("instance")
    docs = data.documents(data.payloads(count=5))
    engine.bulk([WriteOp("instance", d["uuid"], d["version"], d) for d in docs])
    engine.search_timeout = 0.0
    with pytest.raises(EngineUnavailable, match="ran past"):
        engine.search("instance", SearchRequest(Regex("host", "c"), (), 10))
    engine.search_timeout = 10.0
    assert len(engine.search("instance", SearchRequest(MatchAll(), (), 10))) == 5
    engine.close()


def test_select_instances_names_every_dialect() -> None:
    fields = field_map("instance")
    request = SearchRequest(Compare("ip6", Op.GT, "fd00::"), (SortKey("state"),), 2)
    for dialect in DIALECTS:
        text = sql(request, dialect)
        assert "EXISTS" in text and "LIMIT" in text, dialect
    assert fields["ip6"].many
    assert isinstance(select_instances(request, "mysql"), sa.Select)


def test_keyset_bounds_its_first_key_where_one_comparison_can() -> None:
    at = datetime(2024, 3, 1, tzinfo=UTC)
    newest = (SortKey("created_at", Direction.DESC), SortKey("uuid"))
    bounded = after(newest, (at, "u"), {"created_at", "uuid"})
    assert isinstance(bounded, And)
    assert bounded.children[0] == Compare("created_at", Op.LE, at)
    assert bounded.children[1] == after(newest, (at, "u"))  # the OR expansion, unchanged
    # Descending, a field that may be null: nulls come after every value, no plain bound
    assert isinstance(after(newest, (at, "u")), Or)
    # Ascending: nulls come first, so "at or after the value" is one comparison anyway
    oldest = (SortKey("launched_at"), SortKey("uuid"))
    ascending = after(oldest, (at, "u"))
    assert isinstance(ascending, And)
    assert ascending.children[0] == Compare("launched_at", Op.GE, at)
    # After a null: ascending, every row is at or after it; descending, the branches
    # already test for null
    assert isinstance(after(oldest, (None, "u")), Or)
    assert after(newest, (None, "u"), {"created_at"}) == after(newest, (None, "u"))


def test_keyset_pages_can_range_scan_the_sort_index() -> None:
    """prepare takes never-null fields from the registry: created_at and uuid."""
    at = datetime(2024, 3, 1, tzinfo=UTC)
    assert field_map("instance")["created_at"].never_null
    assert not field_map("instance")["launched_at"].never_null
    newest = (SortKey("created_at", Direction.DESC),)
    request = SearchRequest(MatchAll(), newest, 5, after=(at, "u"))
    node, _ = prepare(request, INSTANCE)
    assert isinstance(node, And) and node.children[0] == Compare("created_at", Op.LE, at)
    assert "instances.created_at <= ?" in sql(request, "sqlite")
    by_launch = SearchRequest(MatchAll(), (SortKey("launched_at", Direction.DESC),), 5, (at, "u"))
    assert "instances.launched_at <= ?" not in sql(by_launch, "sqlite")


def test_sql_tests_columns_before_subqueries_and_regexes() -> None:
    tree = And(
        (Regex("display_name", "^web"), Contains("tags", "prod"), Compare("host", Op.EQ, "h"))
    )
    for dialect in DIALECTS:
        text = sql(SearchRequest(tree, (), 5), dialect)
        where = text[text.index("WHERE") :]
        assert where.index("host") < where.index("EXISTS") < where.index("display_name"), dialect


def test_embedded_searches_keep_to_the_search_timeout_setting(tmp_path: Path) -> None:
    """``CELLSIGHT_SEARCH_TIMEOUT`` ("seconds per search engine request") bounded only the
    HTTP engines; the embedded one's searches kept a fixed 10 s (a probe)."""
    from cellsight.clients import build_engine
    from cellsight.settings import load_settings

    engine = build_engine(load_settings(data_dir=tmp_path, search_timeout=0.75))
    assert isinstance(engine, EmbeddedEngine)
    assert engine.search_timeout == 0.75
    engine.close()
