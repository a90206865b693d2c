"""The embedded engine's row building under attack: the fast path (one type signature
checked per document shape, then remembered) must decide exactly as the field-by-field
path does, for any mix of shapes and extreme values, and a shape it has already
accepted must not let a bad value of that shape through.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.sqlite_rows import (
    InvalidDocument,
    Prepared,
    RowBuilder,
    decode_json,
    encode_json,
)
from cellsight.indexer.engines.sqlite_schema import SCHEMAS
from cellsight.indexer.fields import FIELDS_BY_RESOURCE, DocField, Kind

SCHEMA = SCHEMAS["instance"]
FIELDS = FIELDS_BY_RESOURCE["instance"]

extreme_ints = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([2**63, -(2**63) - 1, 10**1000, -(10**400), 0, True, False]),
    # past str()'s 4,300 digits (built, not listed: Hypothesis reprs what it samples)
    st.builds(lambda: 10**5000),
)
extreme_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([512.0, -0.0, 1e308])
)
texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["\ud800", "x" * 1_000_000, "2024-12-31T23:59:59.999999Z", ""]),
)
dates = st.one_of(
    st.sampled_from(
        [
            "2024-12-31T23:59:59.999999Z",
            "2024-02-29T00:00:00Z",
            "9999-12-31T23:59:59+14:00",
            "0001-01-01T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "yesterday",
        ]
    ),
    texts,
)
anything: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), extreme_ints, extreme_floats, texts),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def value_for(f: DocField) -> st.SearchStrategy[Any]:
    """Mostly what the field takes, sometimes anything at all."""
    right: st.SearchStrategy[Any]
    if f.kind is Kind.OBJECT:
        right = st.one_of(
            st.none(), st.lists(st.dictionaries(st.text(max_size=3), texts, max_size=2))
        )
    elif f.many:
        right = st.one_of(st.none(), st.lists(texts, max_size=3))
    elif f.kind is Kind.LONG:
        right = st.one_of(st.none(), extreme_ints)
    elif f.kind is Kind.DOUBLE:
        right = st.one_of(st.none(), extreme_floats, extreme_ints)
    elif f.kind is Kind.BOOLEAN:
        right = st.one_of(st.none(), st.booleans())
    elif f.kind is Kind.DATE:
        right = st.one_of(st.none(), dates)
    else:
        right = st.one_of(st.none(), texts)
    return st.one_of(right, right, right, anything)


documents = st.fixed_dictionaries(
    {},
    optional={f.name: value_for(f) for f in FIELDS},
)


def outcome(make: Any, op: WriteOp) -> tuple[Any, ...] | str:
    try:
        prepared: Prepared = make(op)
    except InvalidDocument:
        return "invalid"
    row = tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in prepared.row)
    return row, prepared.doc, tuple(sorted(prepared.side))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(documents, st.integers(0, 2**63 - 1)), min_size=1, max_size=6))
def test_the_fast_path_decides_as_the_checked_path(batch: list[tuple[dict[str, Any], int]]) -> None:
    builder = RowBuilder(SCHEMA)  # one builder: shapes accepted earlier are remembered
    for doc, version in batch:
        op = WriteOp("instance", "id-1", version, doc)
        assert outcome(builder.prepare, op) == outcome(builder._checked, op)


# Every field present, as the mapping builds documents: the row is taken in one call
# then (``_take``), and a document missing any field falls back to ``get``.
full_documents = st.fixed_dictionaries({f.name: value_for(f) for f in FIELDS})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.one_of(full_documents, documents), st.integers(0, 2**63 - 1)),
        min_size=1,
        max_size=6,
    )
)
def test_whole_documents_decide_as_the_checked_path(
    batch: list[tuple[dict[str, Any], int]],
) -> None:
    builder = RowBuilder(SCHEMA)
    for doc, version in batch:
        op = WriteOp("instance", "id-1", version, doc)
        assert outcome(builder.prepare, op) == outcome(builder._checked, op)


def test_a_whole_document_and_the_same_with_a_field_absent() -> None:
    builder = RowBuilder(SCHEMA)
    whole: dict[str, Any] = dict.fromkeys(f.name for f in FIELDS)
    whole.update(uuid="a", host="h1", tags=["x"], flavor_memory_mb=512)
    taken = builder.prepare(WriteOp("instance", "a", 1, whole))
    assert taken == builder._checked(WriteOp("instance", "a", 1, whole))
    for absent in ("host", "tags", "version"):
        doc = {k: v for k, v in whole.items() if k != absent}
        op = WriteOp("instance", "a", 1, doc)
        assert builder.prepare(op) == builder._checked(op)
    # Every field and one more: the unknown one is named, as on the checked path.
    try:
        builder.prepare(WriteOp("instance", "a", 1, {**whole, "hostname": "h"}))
    except InvalidDocument as exc:
        assert "unknown field [hostname]" in str(exc)
    else:
        raise AssertionError("an unknown field was accepted")
    host = SCHEMA.row_names.index("host")
    assert taken.row[host] == "h1"
    assert builder.prepare(WriteOp("instance", "a", 1, {**whole, "host": None})).row[host] is None


def test_a_mapping_that_invents_values_is_read_as_it_holds_them() -> None:
    # A defaultdict answers a missing key by inserting one: only an exact dict is read
    # by ``itemgetter``; any other mapping takes the field-by-field path, unchanged.
    builder = RowBuilder(SCHEMA)
    whole: dict[str, Any] = dict.fromkeys(f.name for f in FIELDS)
    whole.update(uuid="a", host="h1")
    del whole["host"]
    doc = defaultdict(lambda: "invented", whole)
    prepared = builder.prepare(WriteOp("instance", "a", 1, doc))
    assert "host" not in doc
    assert prepared.row[SCHEMA.row_names.index("host")] is None
    assert "invented" not in prepared.doc
    assert prepared == builder._checked(WriteOp("instance", "a", 1, dict(whole)))


def test_a_remembered_shape_still_checks_values() -> None:
    builder = RowBuilder(SCHEMA)
    good = {"uuid": "a", "flavor_memory_mb": 512, "flavor_rxtx_factor": 1.0}
    builder.prepare(WriteOp("instance", "a", 1, good))  # the shape is now remembered
    for field, bad in (
        ("flavor_memory_mb", 2**63),
        ("flavor_memory_mb", -(2**63) - 1),
        ("flavor_rxtx_factor", float("nan")),
        ("flavor_rxtx_factor", float("inf")),
    ):
        try:
            builder.prepare(WriteOp("instance", "a", 1, {**good, field: bad}))
        except InvalidDocument as exc:
            assert f"[{field}]" in str(exc)
        else:
            raise AssertionError(f"{field}={bad!r} was accepted")


def _msgspec_json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


deep: list[Any] = []
for _ in range(300):
    deep = [deep]


class _Name(str):
    pass


class _Count(int):
    pass


class _Kind(enum.StrEnum):
    A = "a"


@dataclasses.dataclass
class _Record:
    a: int
    _private: int


# What orjson writes otherwise than msgspec, or where msgspec refused it (a review).
_ODD = [
    {1: "int key"},
    {"k": {1, 2}},
    {"k": b"bytes"},
    deep,
    2**64,
    -(2**63),
    {"k": _Name("x")},
    {"k": [_Count(3)]},
    {"k": _Kind.A},
    {"k": _Record(1, 2)},
    {"k": datetime(2024, 1, 1, tzinfo=timezone(timedelta(seconds=30)))},
    {"k": datetime(2024, 1, 1, tzinfo=timezone(-timedelta(hours=1, seconds=30)))},
    {"k": datetime(2024, 1, 1, 0, 0, 0, 5)},
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        anything,
        st.sampled_from(_ODD),
    )
)
def test_a_document_is_stored_as_msgspec_would_store_it(value: Any) -> None:
    """orjson writes what it can (the same values msgspec wrote before it); what it
    refuses (an integer past 64 bits, a key that is no string, nesting past 254, a lone
    surrogate) is msgspec's to write or refuse, as it was."""
    try:
        expected = _msgspec_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            encode_json(value)
        return
    got = encode_json(value)
    assert got == expected or decode_json(got) == decode_json(expected)
