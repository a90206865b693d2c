"""Hypothesis strategies of valid query2 filters, for the parser and differential tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from cellsight.api.query2.fields import REGISTRY, FieldDef, QKind
from cellsight.indexer.fields import Kind

REGEXES = ["^a", "b.*c$", "[0-9]+", "x|y", "(ab)?c", "web-\\d{1,3}", "[^-]+-prod"]
STATUSES = ["ACTIVE", "shutoff", "ERROR", "build", "NOT-A-STATUS"]
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


def _leaf_for(field: FieldDef, seen: Sequence[Any] = ()) -> st.SearchStrategy[list[Any]]:
    """Leaves on ``field``; ``seen`` are values the data holds, drawn as often as not."""
    name = field.name
    truth = st.just(["?", name])
    if field.computed:
        return truth | st.tuples(st.sampled_from(["==", "=", "!="]), st.sampled_from(STATUSES)).map(
            lambda t: [t[0], name, t[1]]
        )
    if field.kind is QKind.BOOL:
        value: st.SearchStrategy[Any] = st.booleans()
        ops = ["==", "=", "!="]
    elif field.doc_kind is Kind.DATE:
        value = st.integers(0, 4_000_000_000) | st.datetimes(
            min_value=datetime(1971, 1, 1), timezones=st.just(UTC)
        ).map(datetime.isoformat)
        ops = ["==", "!=", "<", "<=", ">", ">="]
    elif field.doc_kind is Kind.LONG:
        value = st.integers(-(2**63), 2**63 - 1)
        ops = ["==", "!=", "<", "<=", ">", ">="]
    elif field.doc_kind is Kind.DOUBLE:
        value = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-1000, 1000)
        ops = ["==", "!=", "<", "<=", ">", ">="]
    else:
        value = _text
        ops = ["==", "!=", "<", "<=", ">", ">="]
        regex = st.sampled_from(REGEXES).map(lambda p: ["=~", name, p])
        truth = truth | regex
        if field.many:
            truth = truth | _text.map(lambda v: ["=[]", name, v])
    if seen:
        value = st.sampled_from(list(seen)) | value
        if field.many:
            truth = truth | st.sampled_from(list(seen)).map(lambda v: ["=[]", name, v])
    return truth | st.tuples(st.sampled_from(ops), value).map(lambda t: [t[0], name, t[1]])


def filters(
    resource: str, pool: Mapping[str, Sequence[Any]] | None = None, max_leaves: int = 12
) -> st.SearchStrategy[list[Any]]:
    """Valid filters of ``resource`` (some deeper than the limit: check ``depth``)."""
    pool = pool or {}
    leaves = st.one_of(
        [_leaf_for(f, pool.get(f.name, ())) for f in REGISTRY[resource].values() if f.filterable]
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3).map(lambda c: ["&", *c])
            | st.lists(inner, max_size=3).map(lambda c: ["|", *c])
            | inner.map(lambda c: ["!", c])
        ),
        max_leaves=max_leaves,
    )


def depth(raw: Any) -> int:
    if isinstance(raw, list) and raw and raw[0] in ("&", "|", "!"):
        return 1 + max((depth(c) for c in raw[1:]), default=0)
    return 1
