"""Tree → Elasticsearch/OpenSearch query DSL, order → sort clauses.

Field choices (see ``cellsight.indexer.fields.search_mapping``):

* ``Kind.TEXT`` fields filter, test existence and sort on their ``.raw`` keyword
  sub-field: the analysed field has no order and loses ``""``.
* Dates are ``date_nanos``: documents carry microseconds and the SQL paths compare them
  exactly, while ``date`` keeps milliseconds, so two instants 1 µs apart would tie (sort)
  or be equal (term) in the index only. Values are sent with all six digits.
* Keyword ranges compare UTF-8 bytes, which is code-point order, as the SQL paths do.

Semantics from ``tree.py``: a comparison on a multi-valued field is true when any element
matches, which is what ``term``/``range``/``regexp`` do on arrays; ``!=`` is "some value
below or above" (``range lt`` or ``range gt``), which on a single-valued field is "exists
and differs" and on a multi-valued one "any element differs"; a missing value matches no
leaf query, and ``must_not`` is two-valued, so ``Not`` needs no null handling.

Paging: a keyset page is the tree's ``after()`` expansion compiled as a query, never
``search_after``. Sort values of ``date_nanos`` and long fields exceed 2^53, which osmem
(and any JSON client that decodes numbers as doubles) rounds, so ``search_after`` from
them can skip or repeat rows; and a marker must be usable on every path (index, embedded,
cells fan-out), so it holds document values, not one engine's sort encoding.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cellsight.query import regex
from cellsight.query.fields import DocField, Fields, Kind
from cellsight.query.prepare import QueryError, prepare
from cellsight.query.tree import (
    And,
    Compare,
    Contains,
    Direction,
    Exists,
    In,
    MatchAll,
    MatchNone,
    Node,
    Not,
    Op,
    Or,
    Regex,
    Scalar,
    SearchRequest,
    SortKey,
)

_RANGE = {Op.LT: "lt", Op.LE: "lte", Op.GT: "gt", Op.GE: "gte"}
# What date_nanos can hold. The engines refuse a query bound outside it, and no stored
# date is outside it, so such a bound is decided here: below it is before every date.
NANOS_MIN = datetime(1970, 1, 1, tzinfo=UTC)
NANOS_MAX = datetime(2262, 4, 11, tzinfo=UTC)


def path(f: DocField) -> str:
    """The indexed field a filter or sort on ``f`` uses."""
    return f"{f.name}.raw" if f.kind is Kind.TEXT else f.name


def value(v: Scalar) -> Any:
    if isinstance(v, datetime):
        # all six fractional digits: date_nanos parses them exactly
        return v.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return v


def _bool(**clauses: Any) -> dict[str, Any]:
    return {"bool": clauses}


def compile_filter(node: Node, fields: Fields) -> dict[str, Any]:
    """A prepared tree (``prepare.prepare_filter``) as a query clause."""
    if isinstance(node, MatchAll):
        return {"match_all": {}}
    if isinstance(node, MatchNone):
        return {"match_none": {}}
    if isinstance(node, And):
        return _bool(filter=[compile_filter(c, fields) for c in node.children])
    if isinstance(node, Or):
        return _bool(
            should=[compile_filter(c, fields) for c in node.children], minimum_should_match=1
        )
    if isinstance(node, Not):
        return _bool(must_not=[compile_filter(node.child, fields)])
    f = fields[node.field]
    name = path(f)
    if isinstance(node, Exists):
        return {"exists": {"field": name}}
    if isinstance(node, Contains):
        return {"term": {name: value(node.value)}}
    if isinstance(node, In):
        held = [value(v) for v in node.values if not _outside(v)]
        return {"terms": {name: held}} if held else {"match_none": {}}
    if isinstance(node, Regex):
        pattern = regex.to_lucene(node.pattern)
        # flags NONE: no optional Lucene operators, whatever the engine's default is
        return {"regexp": {name: {"value": pattern, "flags": "NONE"}}}
    if isinstance(node, Compare) and _outside(node.value):
        assert isinstance(node.value, datetime)
        early = node.value < NANOS_MIN
        if node.op in (Op.EQ, Op.NE):
            every = node.op is Op.NE
        else:
            every = (node.op in (Op.GT, Op.GE)) == early
        return {"exists": {"field": name}} if every else {"match_none": {}}
    if isinstance(node, Compare):
        v = value(node.value)
        if node.op is Op.EQ:
            return {"term": {name: v}}
        if node.op is Op.NE:
            below, above = {"range": {name: {"lt": v}}}, {"range": {name: {"gt": v}}}
            return _bool(should=[below, above], minimum_should_match=1)
        return {"range": {name: {_RANGE[node.op]: v}}}
    raise QueryError(f"not a filter node: {node!r:.80}")


def _outside(v: Scalar) -> bool:
    return isinstance(v, datetime) and not NANOS_MIN <= v <= NANOS_MAX


def compile_sort(order: tuple[SortKey, ...], fields: Fields) -> list[dict[str, Any]]:
    """Sort clauses: null is the smallest value, so first ascending and last descending."""
    clauses = []
    for key in order:
        asc = key.direction is Direction.ASC
        clauses.append(
            {
                path(fields[key.field]): {
                    "order": "asc" if asc else "desc",
                    "missing": "_first" if asc else "_last",
                }
            }
        )
    return clauses


def search_body(request: SearchRequest, fields: Fields) -> dict[str, Any]:
    """The ``_search`` body of one page: filter with keyset, total order, size."""
    node, order = prepare(request, fields)
    return {
        "query": compile_filter(node, fields),
        "sort": compile_sort(order, fields),
        "size": request.limit,
        "version": True,
        "track_total_hits": False,
    }
