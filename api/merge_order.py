"""The total order in Python: one key function for the fan-out merge and the tests.

It implements ``cellsight.query.tree``'s order exactly: values compared as the document
holds them (dates as instants, strings by code point), null the smallest value (first
ascending, last descending), ``uuid`` ascending last. The cells (``ORDER BY`` with
``C``/binary collations) and the engines sort the same way; ``tests/api`` checks this
key against both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from cellsight.indexer.documents import DATE_FIELDS
from cellsight.query.tree import Direction, Scalar, SortKey


class _Desc:
    """Reverses the comparison of what it wraps (descending keys)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.value < self.value)

    def __gt__(self, other: _Desc) -> bool:
        return bool(other.value > self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and bool(self.value == other.value)

    def __hash__(self) -> int:
        return hash(self.value)


def parse_date(value: str | datetime) -> datetime:
    """A document date (Nova's ``…Z`` form, with or without microseconds) as aware UTC."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def comparable(field: str, value: Any) -> Any:
    """A value in the form it is compared in (dates as instants)."""
    if value is None:
        return None
    if field in DATE_FIELDS:
        return parse_date(value)
    return value


def sort_values(doc: Mapping[str, Any], order: tuple[SortKey, ...]) -> tuple[Scalar, ...]:
    """A document's values for ``order``: what a keyset (``after``) starts from."""
    return tuple(comparable(k.field, doc.get(k.field)) for k in order)


def order_key(order: tuple[SortKey, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The sort key of a document (or any mapping of document field names)."""
    plan = [(k.field, k.field in DATE_FIELDS, k.direction is Direction.DESC) for k in order]

    def key(doc: Mapping[str, Any]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for field, is_date, desc in plan:
            value = doc.get(field)
            # (0,) for null sorts before (1, v) for any value: null is the smallest.
            if value is None:
                part: tuple[Any, ...] = (0,)
            else:
                part = (1, parse_date(value) if is_date else value)
            parts.append(_Desc(part) if desc else part)
        return tuple(parts)

    return key
