"""Tree → SQLAlchemy Core boolean expression, order → ORDER BY, for SQLite, PostgreSQL
and MariaDB/MySQL, given a ``Resolver`` that maps document fields to SQL.

Semantics from ``tree.py``, made exact in SQL:

* Three-valued logic: ``NOT (col = 'x')`` is NULL, not true, when ``col`` is NULL,
  while the tree says a missing value fails the comparison so its negation holds.
  Negations are pushed down to the leaves (De Morgan), and a negated leaf on a nullable
  column is ``col IS NULL OR NOT (...)``; a positive leaf's NULL acts as false.
* Strings compare and sort by code point: PostgreSQL ``COLLATE "C"``; MariaDB
  ``CAST(... AS BINARY)`` (UTF-8 byte order is code-point order, and unlike
  ``utf8mb4_bin``, which is PAD SPACE, it does not ignore trailing spaces: there
  ``'a' = 'a '`` and ``'a\\t' < 'a'``); equality keeps a plain ``col = v`` beside it so
  an index still narrows the rows. SQLite's default BINARY collation already is.
* Nulls sort first ascending and last descending: ``NULLS FIRST/LAST`` on SQLite and
  PostgreSQL; MariaDB has no such clause, so ``col IS NULL`` is ordered first.
* Multi-valued fields are "any element" ``EXISTS`` subqueries built by the resolver;
  a field that is one value per database (``Const``, e.g. a cell's ``cell_uuid``) is
  decided in Python and folds to true or false.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from cellsight.query import regex
from cellsight.query.fields import DocField, Kind
from cellsight.query.prepare import STRING_KINDS, QueryError
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
    SortKey,
)

Expr = sa.ColumnElement[Any]
Condition = sa.ColumnElement[bool]
MYSQL_DIALECTS = ("mysql", "mariadb")


@dataclass(frozen=True)
class Column:
    """A single-valued field as a SQL expression; ``bind`` maps a canonical value (see
    ``prepare``) to what the expression holds (e.g. a date to epoch microseconds)."""

    expr: Expr
    kind: Kind
    nullable: bool = True
    bind: Callable[[Any], Any] | None = None
    # Its strings never end in a character at or below U+0020 (uuids), so MariaDB's
    # PAD SPACE collation already orders them by code point: no cast, index order kept.
    pad_safe: bool = False


@dataclass(frozen=True)
class Const:
    """A field with one value for every row the query can see (``None``: missing)."""

    value: Scalar


@dataclass(frozen=True)
class Many:
    """A multi-valued field: ``any(predicate)`` is EXISTS over its elements, each given
    to ``predicate`` as a string expression."""

    any: Callable[[Callable[[Expr], Condition]], Condition]
    kind: Kind


Resolved = Column | Const | Many


class Resolver(Protocol):
    dialect: str  # "sqlite", "postgresql", "mariadb" or "mysql"

    def resolve(self, field: DocField) -> Resolved: ...


_POSTGRESQL = postgresql.dialect()


def _declared_collation(expr: Expr) -> str | None:
    """The PostgreSQL collation a table column declares (``Str`` declares "C")."""
    if not isinstance(expr, sa.Column):
        return None
    return getattr(expr.type.dialect_impl(_POSTGRESQL), "collation", None)


def comparable(expr: Expr, kind: Kind, dialect: str, *, pad_safe: bool = False) -> Expr:
    """``expr`` as compared and sorted: strings in code-point order. A column already
    declared so is left bare, so its indexes keep serving ORDER BY."""
    if kind not in STRING_KINDS:
        return expr
    if dialect == "postgresql":
        return expr if _declared_collation(expr) == "C" else expr.collate("C")
    if pad_safe and dialect in MYSQL_DIALECTS:
        return expr
    if dialect in MYSQL_DIALECTS:
        # typed as a string again, so values still bind as text (compared as binary)
        return sa.type_coerce(sa.cast(expr, mysql.BINARY()), sa.String())
    return expr


def regex_match(expr: Expr, pattern: str, dialect: str) -> Condition:
    if dialect == "postgresql":
        return expr.collate("C").op("~", is_comparison=True)(regex.to_postgresql(pattern))
    if dialect in MYSQL_DIALECTS:
        # utf8mb4 whatever the column's charset (uuid is ascii), binary collation:
        # case-sensitive; the pattern's (?-i) says so again.
        text = sa.cast(expr, mysql.CHAR(charset="utf8mb4")).collate("utf8mb4_bin")
        return text.op("REGEXP", is_comparison=True)(regex.to_mariadb(pattern))
    # SQLite: "x REGEXP p" calls the registered regexp(p, x) (see sqlite_regexp), which
    # takes the subset's own pattern: past a name's length it matches by automaton.
    return expr.op("REGEXP", is_comparison=True)(regex.validate(pattern))


_OPS: dict[Op, Callable[[Expr, Any], Condition]] = {
    Op.EQ: lambda e, v: e == v,
    Op.NE: lambda e, v: e != v,
    Op.LT: lambda e, v: e < v,
    Op.LE: lambda e, v: e <= v,
    Op.GT: lambda e, v: e > v,
    Op.GE: lambda e, v: e >= v,
}
_PY_OPS: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: lambda a, b: bool(a == b),
    Op.NE: lambda a, b: bool(a != b),
    Op.LT: lambda a, b: bool(a < b),
    Op.LE: lambda a, b: bool(a <= b),
    Op.GT: lambda a, b: bool(a > b),
    Op.GE: lambda a, b: bool(a >= b),
}


def _const_leaf(node: Node, value: Scalar) -> bool:
    """A leaf on a ``Const`` field, decided in Python with the tree's semantics."""
    if isinstance(node, Exists):
        return value is not None
    if value is None:
        return False
    if isinstance(node, Compare):
        return _PY_OPS[node.op](value, node.value)
    if isinstance(node, In):
        return value in node.values
    if isinstance(node, Regex):
        return isinstance(value, str) and regex.matcher(node.pattern)(value)
    raise QueryError(f"{type(node).__name__} needs a multi-valued field")


class SqlCompiler:
    """Compiles prepared trees and total orders (``prepare.prepare``) for one resolver."""

    def __init__(self, resolver: Resolver, fields: Mapping[str, DocField]) -> None:
        self.resolver = resolver
        self.dialect = resolver.dialect
        self.fields = fields

    def where(self, node: Node) -> Condition:
        return self._compile(node, positive=True)

    def _compile(self, node: Node, *, positive: bool) -> Condition:
        if isinstance(node, MatchAll | MatchNone):
            return sa.true() if isinstance(node, MatchAll) == positive else sa.false()
        if isinstance(node, Not):
            return self._compile(node.child, positive=not positive)
        if isinstance(node, And | Or):
            # Cheap tests first: SQLite (and MariaDB) evaluate a conjunction's terms in
            # the order written and stop at the first false one, and a regex is a call
            # into Python per row on SQLite. The order changes no result.
            children = sorted(node.children, key=self._cost)
            parts = [self._compile(c, positive=positive) for c in children]
            # De Morgan: a negated AND is an OR of negations, and vice versa
            return sa.and_(*parts) if isinstance(node, And) == positive else sa.or_(*parts)
        resolved = self.resolver.resolve(self.fields[node.field])
        if isinstance(resolved, Const):
            decided = _const_leaf(node, resolved.value)
            return sa.true() if decided == positive else sa.false()
        if isinstance(resolved, Many):
            test = resolved.any(lambda element: self._leaf(node, element, resolved.kind, None))
            return test if positive else sa.not_(test)
        if isinstance(node, Exists):
            return resolved.expr.is_not(None) if positive else resolved.expr.is_(None)
        if isinstance(node, Contains):
            raise QueryError(f"field {node.field!r} has one value: contains needs many")
        test = self._leaf(node, resolved.expr, resolved.kind, resolved.bind, resolved.pad_safe)
        if positive:
            return test
        if resolved.nullable:
            return sa.or_(resolved.expr.is_(None), sa.not_(test))
        return sa.not_(test)

    def _cost(self, node: Node) -> int:
        """A rough rank of evaluating ``node`` per row: a column test 0, a test on a
        multi-valued field's elements (a subquery) 1, a regex 2, a regex on elements 3."""
        if isinstance(node, MatchAll | MatchNone):
            return 0
        if isinstance(node, Not):
            return self._cost(node.child)
        if isinstance(node, And | Or):
            return max(self._cost(c) for c in node.children)
        f = self.fields.get(node.field)
        many = f is not None and f.many and f.kind is not Kind.OBJECT
        return (1 if many else 0) + (2 if isinstance(node, Regex) else 0)

    def _leaf(
        self,
        node: Node,
        expr: Expr,
        kind: Kind,
        bind: Callable[[Any], Any] | None,
        pad_safe: bool = False,
    ) -> Condition:
        """The positive test of one leaf on a value (a column or one element)."""
        convert: Callable[[Any], Any] = bind or (lambda v: v)
        if isinstance(node, Exists):
            return sa.true()  # an element exists: Many.any already says so
        if isinstance(node, Regex):
            return regex_match(expr, node.pattern, self.dialect)
        given = node.values if isinstance(node, In) else (getattr(node, "value", None),)
        # MySQL's uuid columns are ascii: comparing one with a non-ASCII value is an error
        # ("illegal mix of collations"), so such a value is compared as bytes, which no
        # stored uuid equals and code-point order still holds for.
        foreign = pad_safe and any(isinstance(v, str) and not v.isascii() for v in given)
        # PAD SPACE and binary order differ only around a trailing character <= U+0020
        trailing = any(isinstance(v, str) and v[-1:] <= " " for v in given)
        pad_safe = pad_safe and not foreign and not trailing
        ordered = comparable(expr, kind, self.dialect, pad_safe=pad_safe)
        exact_only = ordered is not expr and self.dialect in MYSQL_DIALECTS and not foreign
        if isinstance(node, Contains | Compare):
            op = node.op if isinstance(node, Compare) else Op.EQ
            value = convert(node.value)
            test = _OPS[op](ordered, value)
            if op is Op.EQ and exact_only and isinstance(expr, sa.ColumnClause):
                return sa.and_(expr == value, test)  # the plain one can use an index
            return test
        if isinstance(node, In):
            values = [convert(v) for v in node.values]
            test = ordered.in_(values)
            if exact_only and isinstance(expr, sa.ColumnClause):
                return sa.and_(expr.in_(values), test)
            return test
        raise QueryError(f"not a filter node: {node!r:.80}")

    def order_by(self, order: tuple[SortKey, ...]) -> list[Expr]:
        clauses: list[Expr] = []
        for key in order:
            resolved = self.resolver.resolve(self.fields[key.field])
            if isinstance(resolved, Const):
                continue  # one value for all rows: orders nothing here
            if isinstance(resolved, Many):
                raise QueryError(f"field {key.field!r} has many values: it cannot be sorted")
            expr = comparable(
                resolved.expr, resolved.kind, self.dialect, pad_safe=resolved.pad_safe
            )
            asc = key.direction is Direction.ASC
            if not resolved.nullable:
                clauses.append(expr.asc() if asc else expr.desc())
            elif self.dialect in MYSQL_DIALECTS:
                # no NULLS FIRST/LAST: order by "is null" first (true=1 sorts after 0)
                is_null = resolved.expr.is_(None)
                clauses.append(is_null.desc() if asc else is_null.asc())
                clauses.append(expr.asc() if asc else expr.desc())
            else:
                clauses.append(expr.asc().nulls_first() if asc else expr.desc().nulls_last())
        return clauses
