"""S-expression filters → the filter tree: each operator, each named error, and properties."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import mysql, postgresql, sqlite

from cellsight.api.cell_query import select_instances
from cellsight.api.query2.evaluate import evaluate
from cellsight.api.query2.fields import COMPUTED, REGISTRY
from cellsight.api.query2.nodes import with_derived
from cellsight.api.query2.sexpr import (
    MAX_DEPTH,
    MAX_TERMS,
    BadFilterRegex,
    FieldNotFilterable,
    FilterError,
    FilterTooDeep,
    FilterTooLarge,
    MalformedFilter,
    ParsedFilter,
    UnknownFilterField,
    WrongValueKind,
    parse,
    parse_filter,
)
from cellsight.indexer.engines.sqlite_schema import SCHEMAS
from cellsight.indexer.engines.sqlite_search import EmbeddedColumns
from cellsight.indexer.fields import field_map
from cellsight.query.dsl import search_body
from cellsight.query.prepare import prepare
from cellsight.query.sql import SqlCompiler
from cellsight.query.tree import (
    Compare,
    Contains,
    Exists,
    MatchAll,
    MatchNone,
    Node,
    Not,
    Op,
    Or,
    Regex,
    SearchRequest,
    SortKey,
)
from tests.support.query2_filters import depth, filters


def test_no_filter_matches_everything() -> None:
    assert parse_filter("instance", None) == MatchAll()


@pytest.mark.parametrize(
    ("op", "want"),
    [("==", Op.EQ), ("=", Op.EQ), ("<", Op.LT), ("<=", Op.LE), (">", Op.GT), (">=", Op.GE)],
)
def test_comparisons(op: str, want: Op) -> None:
    assert parse_filter("instance", [op, "progress", 5]) == Compare("progress", want, 5)


def test_not_equal_is_the_negation_of_equal() -> None:
    # A missing task_state differs from "deleting", as in Ganeti.
    got = parse_filter("instance", ["!=", "task_state", "deleting"])
    assert got == Not(Compare("task_state", Op.EQ, "deleting"))


def test_name_maps_to_the_document_field() -> None:
    assert parse_filter("instance", ["==", "name", "web"]) == Compare("display_name", Op.EQ, "web")


def test_boolean_operators_and_flattening() -> None:
    a, b = ["==", "name", "a"], ["==", "uuid", "b"]
    got = parse_filter("instance", ["|", a, ["!", b]])
    assert got == Or((Compare("display_name", Op.EQ, "a"), Not(Compare("uuid", Op.EQ, "b"))))
    assert parse_filter("instance", ["&"]) == MatchAll()
    assert parse_filter("instance", ["|"]) == MatchNone()
    assert parse_filter("instance", ["&", a]) == Compare("display_name", Op.EQ, "a")


def test_truth_operator_follows_ganeti() -> None:
    assert parse_filter("instance", ["?", "locked"]) == Compare("locked", Op.EQ, True)
    assert parse_filter("instance", ["?", "host"]) == Compare("host", Op.NE, "")
    assert parse_filter("instance", ["?", "progress"]) == Compare("progress", Op.NE, 0)
    assert parse_filter("instance", ["?", "tags"]) == Exists("tags")
    assert parse_filter("instance", ["?", "deleted_at"]) == Exists("deleted_at")
    assert parse_filter("instance", ["?", "status"]) == MatchAll()


def test_regex_and_contains() -> None:
    assert parse_filter("instance", ["=~", "name", "^web-[0-9]+$"]) == Regex(
        "display_name", "^web-[0-9]+$"
    )
    assert parse_filter("instance", ["=~", "ip4", "^10\\."]) == Regex("ip4", "^10\\.")
    assert parse_filter("instance", ["=[]", "tags", "prod"]) == Contains("tags", "prod")


def test_timestamps_take_epoch_seconds_or_iso() -> None:
    want = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    for value in (want.timestamp(), "2024-05-01T12:00:00Z", "2024-05-01T14:00:00+02:00"):
        assert parse_filter("instance", [">", "created_at", value]) == Compare(
            "created_at", Op.GT, want
        )


def test_numbers_by_field_kind() -> None:
    assert parse_filter("instance", ["==", "flavor_memory_mb", 512.0]) == Compare(
        "flavor_memory_mb", Op.EQ, 512
    )
    assert parse_filter("instance", ["<", "flavor_rxtx_factor", 1]) == Compare(
        "flavor_rxtx_factor", Op.LT, 1.0
    )
    assert parse_filter("node", [">=", "memory_mb_used", 1024]) == Compare(
        "memory_mb_used", Op.GE, 1024
    )


def test_status_is_matched_through_vm_and_task_state() -> None:
    tree = parse_filter("instance", ["==", "status", "shutoff"])
    assert "state" in repr(tree) and "stopped" in repr(tree)
    assert parse_filter("instance", ["!=", "status", "ACTIVE"]) == Not(
        parse_filter("instance", ["==", "status", "ACTIVE"])
    )


@pytest.mark.parametrize(
    ("raw", "error", "names"),
    [
        (["==", "nosuch", 1], UnknownFilterField, "nosuch"),
        (["?", "bogus"], UnknownFilterField, "bogus"),
        (["==", "progress", "high"], WrongValueKind, "progress"),
        (["==", "progress", 1.5], WrongValueKind, "progress"),
        (["==", "progress", True], WrongValueKind, "progress"),
        (["==", "progress", 2**70], WrongValueKind, "progress"),
        (["==", "name", 3], WrongValueKind, "name"),
        (["==", "name", None], WrongValueKind, "name"),
        (["==", "locked", "yes"], WrongValueKind, "locked"),
        ([">", "created_at", "yesterday"], WrongValueKind, "created_at"),
        (["==", "status", 1], WrongValueKind, "status"),
        (["<", "locked", True], MalformedFilter, "locked"),
        (["<", "status", "ACTIVE"], MalformedFilter, "status"),
        (["=[]", "name", "x"], MalformedFilter, "name"),
        (["=~", "progress", "1"], MalformedFilter, "progress"),
        (["=~", "name", "(a+)+"], BadFilterRegex, "name"),
        (["=~", "name", "a{1"], BadFilterRegex, "name"),
        (["=~", "name", 5], WrongValueKind, "name"),
        (["==", "metadata", "x"], FieldNotFilterable, "metadata"),
        (["~", "name", "x"], MalformedFilter, "'~'"),
        (["==", "name"], MalformedFilter, "=="),
        (["!", ["==", "name", "a"], ["==", "name", "b"]], MalformedFilter, "!"),
        ([], MalformedFilter, "list"),
        ("name", MalformedFilter, "list"),
        ({"==": 1}, MalformedFilter, "list"),
        ([["==", "name", "a"]], MalformedFilter, "operator"),
        (["==", 1, 1], MalformedFilter, "field name"),
    ],
)
def test_named_errors(raw: Any, error: type[FilterError], names: str) -> None:
    with pytest.raises(error) as info:
        parse_filter("instance", raw)
    assert names in str(info.value)


def test_node_fields_are_their_own() -> None:
    with pytest.raises(UnknownFilterField, match="node field 'flavor_name'"):
        parse_filter("node", ["==", "flavor_name", "x"])
    assert parse_filter("node", ["?", "offline"]) == Compare("offline", Op.EQ, True)


def _nest(depth: int) -> list[Any]:
    tree: list[Any] = ["==", "name", "a"]
    for _ in range(depth - 1):
        tree = ["!", tree]
    return tree


def test_depth_limit() -> None:
    parse_filter("instance", _nest(MAX_DEPTH))
    with pytest.raises(FilterTooDeep, match=str(MAX_DEPTH)):
        parse_filter("instance", _nest(MAX_DEPTH + 1))
    # Deep nesting is refused before it is walked: no RecursionError.
    with pytest.raises(FilterTooDeep):
        parse_filter("instance", _nest(5000))


def test_width_limit() -> None:
    leaf = ["==", "uuid", "x"]
    parse_filter("instance", ["|", *[leaf] * (MAX_TERMS - 1)])
    with pytest.raises(FilterTooLarge, match=str(MAX_TERMS)):
        parse_filter("instance", ["|", *[leaf] * MAX_TERMS])


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(WrongValueKind) as info:
        parse_filter("instance", ["==", "progress", "x" * 10_000])
    assert len(str(info.value)) < 200


# Properties ------------------------------------------------------------------------

_FILTERS = {resource: filters(resource) for resource in ("instance", "node")}
_DIALECTS = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.dialect(),
    "mariadb": mysql.dialect(),
}


def compile_everywhere(resource: str, tree: Node) -> None:
    """The tree as every path runs it: the engines' DSL, the embedded index's SQL, and
    (instances) each cell dialect's SQL."""
    request = SearchRequest(tree, (SortKey("uuid"),), 10)
    search_body(request, field_map(resource))
    node, _ = prepare(request, field_map(resource))
    columns = EmbeddedColumns(SCHEMAS[resource], "q2-index")
    embedded = SqlCompiler(columns, field_map(resource))
    str(sa.select(columns.table).where(embedded.where(node)).compile(dialect=_DIALECTS["sqlite"]))
    if resource == "instance":
        for name, dialect in _DIALECTS.items():
            str(select_instances(request, name, cell_uuid="c1").compile(dialect=dialect))


_NODE_COMPUTED = frozenset(f.name for f in COMPUTED["node"])
# A node as a snapshot holds it: the stored fields and the ones each snapshot adds.
_A_NODE = with_derived(
    {"hypervisor_hostname": "n1", "memory_mb": 4096, "memory_mb_used": 512}, "c1"
)


def run_everywhere(resource: str, parsed: ParsedFilter) -> None:
    """A filter the parser accepted, as the API runs it: compiled on every path, except a
    node filter naming a field each snapshot adds, which only the in-memory evaluation
    sees (``api/query2/nodes.select``): that one must evaluate to a truth value."""
    if resource == "node" and parsed.fields & _NODE_COMPUTED:
        assert evaluate(parsed.tree, _A_NODE) in (True, False, None)
        return
    compile_everywhere(resource, parsed.tree)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resource=st.sampled_from(["instance", "node"]), data=st.data())
def test_valid_filters_parse_and_compile(resource: str, data: st.DataObject) -> None:
    raw = data.draw(_FILTERS[resource])
    if depth(raw) > MAX_DEPTH:
        with pytest.raises(FilterTooDeep):
            parse_filter(resource, raw)
        return
    run_everywhere(resource, parse(resource, raw))


_odd_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=6) | st.sampled_from(
    ["\x00", "a\ud800", "", "^", "(a+)+", "2024-01-01", "NaN"]
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _odd_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)
_ops = st.sampled_from(["&", "|", "!", "?", "==", "=", "!=", "<", "<=", ">", ">=", "=~", "=[]"])
_names = st.sampled_from([*REGISTRY["instance"], *REGISTRY["node"], "nosuch", ""])
_junk_leaf = st.tuples(_ops, st.lists(_names | _json, max_size=3)).map(lambda t: [t[0], *t[1]])
_junk = st.recursive(
    _junk_leaf | _json,
    lambda inner: st.tuples(_ops, st.lists(inner, max_size=3)).map(lambda t: [t[0], *t[1]]),
    max_leaves=15,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resource=st.sampled_from(["instance", "node"]), raw=_junk)
def test_junk_gives_a_named_error_or_a_compilable_tree(resource: str, raw: Any) -> None:
    try:
        parsed = parse(resource, raw)
    except FilterError as exc:
        assert str(exc).startswith("filter: ")
        return
    run_everywhere(resource, parsed)
