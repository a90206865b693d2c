"""The filter tree evaluated in Python, on documents, with the tree's semantics.

Used where the data is already in memory: node queries (the node state cache holds
every node document) and the placeholder rows of instances whose cell did not answer,
of which only the mapping's fields are known. Three-valued (Kleene) logic: a predicate
on an unknown field is ``None``, and ``None`` survives ``&``/``|``/``!`` unless the
known part decides; callers keep a row when the result is not ``False`` ("may match").
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from cellsight.query.regex import matcher
from cellsight.query.tree import (
    And,
    Compare,
    Contains,
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
)

Truth = bool | None
# Of every ``Deadline``: the evaluating thread's CPU time, so that a server busy with
# other requests does not make a cheap filter "too costly" (tests move it).
CLOCK: Callable[[], float] = time.thread_time


class EvaluationDeadline(Exception):
    """Evaluating a filter over documents in memory ran past its bound."""

    def __init__(self, bound: float, items: int) -> None:
        super().__init__(
            f"evaluating the filter ran past {bound:g} s of CPU ({items} items read); narrow "
            "it or use fewer regular expressions or globs"
        )


class Deadline:
    """The bound of one evaluation over many documents: the engines and the cells bound
    a search by time, and a filter evaluated here (hundreds of regular expressions on
    every node, a resource-exhaustion probe) held a core for minutes otherwise."""

    def __init__(self, seconds: float, clock: Callable[[], float] | None = None) -> None:
        self.seconds = seconds
        self.clock = clock or CLOCK
        self._end = self.clock() + seconds
        self.items = 0

    def check(self) -> None:
        """Before each document: raises ``EvaluationDeadline`` once the bound is past."""
        self.items += 1
        if self.clock() > self._end:
            raise EvaluationDeadline(self.seconds, self.items - 1)


_OPS: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}


def evaluate(node: Node, doc: Mapping[str, Any], known: Collection[str] | None = None) -> Truth:
    """Whether ``doc`` matches; ``known`` limits the fields whose values are known."""
    if isinstance(node, MatchAll):
        return True
    if isinstance(node, MatchNone):
        return False
    if isinstance(node, And | Or):
        # Kleene: one False decides an and, one True an or; an unknown only if none does.
        decides = isinstance(node, Or)
        unknown = False
        for child in node.children:
            result = evaluate(child, doc, known)
            if result is decides:
                return decides
            unknown = unknown or result is None
        return None if unknown else not decides
    if isinstance(node, Not):
        inner = evaluate(node.child, doc, known)
        return None if inner is None else not inner
    if known is not None and node.field not in known:
        return None
    values = _values(doc.get(node.field))
    if isinstance(node, Exists):
        return bool(values)
    if isinstance(node, Compare):
        return any(_compare(v, node.op, node.value) for v in values)
    if isinstance(node, In):
        return any(_compare(v, Op.EQ, want) for v in values for want in node.values)
    if isinstance(node, Contains):
        return node.value in values
    if isinstance(node, Regex):
        matches = matcher(node.pattern)
        return any(isinstance(v, str) and matches(v) for v in values)
    raise TypeError(f"not a filter node: {node!r}")


def _values(value: Any) -> list[Any]:
    """The values of a field: a missing value (null, empty list) has none."""
    if value is None:
        return []
    if isinstance(value, list):
        return [v for v in value if v is not None]
    return [value]


def _compare(have: Any, op: Op, want: Scalar) -> bool:
    if isinstance(want, datetime):
        have = _instant(have)
        if have is None:
            return False
    elif isinstance(want, bool) != isinstance(have, bool):
        return False  # True is not 1 in a document
    try:
        return _OPS[op](have, want)
    except TypeError:
        return False  # values of another type match no comparison


def _instant(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None
