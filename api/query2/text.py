"""Ganeti's human-readable filter syntax → the S-expressions of ``cellsight.api.query2.sexpr``.

The grammar is Ganeti's (``lib/qlang.py``), operators by falling precedence
``not`` > ``and`` > ``or``, parentheses to group::

    f == v   f = v   f != v   f < v   f <= v   f > v   f >= v
    v in f   v not in f                     membership of a list field
    f =~ m/re/flags   f !~ m/re/flags       delimiters / # ^ |, the "m" optional
    f =* "glob"   f !* "glob"               DNS-name globbing: * and ? stop at dots
    f                                       the field is true (Ganeti's ``?``)

Field names start with a letter and go on with letters, digits, ``_``, ``/`` and
``.``; values are integers (an optional sign) or single- or double-quoted strings.
Where Ganeti's grammar is silent or lossy this parser decides, so that every
S-expression has a text form (``to_text``) that parses back to the same tree:

* ``true``/``false`` are values (bool fields) and, standing alone, the empty ``and``
  (match everything) and the empty ``or`` (match nothing);
* numbers may have a fraction or exponent (``1.5``, ``-2e+30``: double fields);
* a backslash in a quoted string takes the next character literally (``"a\\"b"``);
  in a regex it only escapes the delimiter, every other escape reaches the regex;
* regex flags: ``s`` is accepted and changes nothing (``.`` already matches a
  newline in the portable subset); ``i`` is refused, the subset is case-sensitive;
* a glob becomes ``["|", ["=~", f, "^glob$"], ["=~", f, "^glob\\."]]``: Ganeti's
  ``^glob(\\..*)?$`` nests quantifiers, which the portable subset refuses. Each ``*`` is
  an unbounded quantifier, and the subset's bound allows two (``MAX_GLOB_STARS``): a glob
  with more is refused naming its stars, not the regex the user never wrote.

Every error is a ``FilterError`` (so the API answers 400) whose message starts with
the 1-based column it points at, and carries that column in ``column``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

from cellsight.api.query2.sexpr import MAX_DEPTH, MAX_TERMS, FilterError, ParsedFilter, parse
from cellsight.query.regex_syntax import MAX_CHOICES, MAX_LENGTH, UNBOUNDED_CHOICES

MAX_TEXT = 64 * 1024  # a filter is typed by a person; longer is a mistake or an attack
MAX_NESTING = 4 * MAX_DEPTH  # parentheses and "not" before the tree's own depth check
MAX_DIGITS = 400  # past any 64-bit integer or double; int() of huge strings is quadratic

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_/.]*")
_NUMBER = re.compile(r"[-+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_SPACE = re.compile(r"\s*")
_BINARY = {"==": "==", "=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
# Longest first, so "<=" is not read as "<" followed by "=".
_OPERATORS = ("==", "=~", "=*", "!=", "!~", "!*", "<=", ">=", "=", "<", ">")
_KEYWORDS = frozenset({"and", "or", "not", "in", "true", "false"})
_REGEX_DELIMITERS = "/#^|"
_GLOB_SPECIAL = set(".^$|?*+()[]{}\\/")


class TextFilterError(FilterError):
    """A filter text that does not parse, or names something wrong, at ``column``."""

    def __init__(self, column: int, reason: str, code: str = "malformed_filter") -> None:
        self.column = column
        self.code = code
        super().__init__(f"filter: column {column}: {reason}")


def parse_text(resource: str, text: str) -> ParsedFilter:
    """Parse, check and convert a filter text; ``FilterError`` names the column."""
    raw, columns = to_sexpr(text)
    _check(resource, raw, columns)
    try:
        return parse(resource, raw)
    except FilterError as exc:  # whatever the per-leaf checks could not place
        raise TextFilterError(1, _reason(exc), exc.code) from None


def to_sexpr(text: str) -> tuple[Any, dict[int, int]]:
    """The S-expression of ``text`` and the column of each of its lists (by ``id``)."""
    if len(text) > MAX_TEXT:
        raise TextFilterError(MAX_TEXT + 1, f"the filter is longer than {MAX_TEXT} characters")
    parser = _Parser(text)
    raw = parser.expression(0)
    parser.skip()
    if parser.pos < len(text):
        raise parser.error("expected 'and', 'or' or the end of the filter")
    return raw, parser.columns


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.columns: dict[int, int] = {}

    def error(self, reason: str, pos: int | None = None) -> TextFilterError:
        at = self.pos if pos is None else pos
        found = self.text[at : at + 20]
        where = f"at {found!r}" if found else "at the end"
        return TextFilterError(at + 1, f"{reason} ({where})")

    def node(self, pos: int, *items: Any) -> list[Any]:
        out = list(items)
        self.columns[id(out)] = pos + 1
        return out

    def skip(self) -> None:
        match = _SPACE.match(self.text, self.pos)
        self.pos = match.end() if match else self.pos

    def word(self) -> str | None:
        """The next word without consuming it."""
        self.skip()
        match = _WORD.match(self.text, self.pos)
        return match.group() if match else None

    def keyword(self, name: str) -> bool:
        if self.word() == name:
            self.pos += len(name)
            return True
        return False

    def expression(self, nesting: int) -> Any:
        return self.chain("or", "|", self.conjunction, nesting)

    def conjunction(self, nesting: int) -> Any:
        return self.chain("and", "&", self.negation, nesting)

    def chain(self, word: str, op: str, operand: Any, nesting: int) -> Any:
        self.skip()
        start = self.pos
        items = [operand(nesting)]
        while self.keyword(word):
            items.append(operand(nesting))
        return items[0] if len(items) == 1 else self.node(start, op, *items)

    def negation(self, nesting: int) -> Any:
        self.skip()
        start = self.pos
        if self.word() == "not":
            if nesting >= MAX_NESTING:
                raise self.error(f"nested deeper than {MAX_NESTING} levels")
            self.pos += 3
            return self.node(start, "!", self.negation(nesting + 1))
        return self.atom(nesting)

    def atom(self, nesting: int) -> Any:
        self.skip()
        if self.text.startswith("(", self.pos):
            if nesting >= MAX_NESTING:
                raise self.error(f"nested deeper than {MAX_NESTING} levels")
            self.pos += 1
            inner = self.expression(nesting + 1)
            self.skip()
            if not self.text.startswith(")", self.pos):
                raise self.error("expected ')'")
            self.pos += 1
            return inner
        return self.condition()

    def condition(self) -> Any:
        start = self.pos
        word = self.word()
        quoted = self.text.startswith(("'", '"'), self.pos)
        if word is None and not quoted and not _NUMBER.match(self.text, self.pos):
            raise self.error("expected a condition: a field name, a value before 'in', or '('")
        if word is None or word in ("true", "false"):
            value = self.value()
            if self.keyword("in"):
                return self.node(self.field_pos(), "=[]", self.field(), value)
            if self.keyword("not"):
                if not self.keyword("in"):
                    raise self.error("expected 'in' after 'not'")
                member = self.node(self.field_pos(), "=[]", self.field(), value)
                return self.node(start, "!", member)
            if isinstance(value, bool):
                return self.node(start, "&" if value else "|")
            raise self.error("expected 'in' or 'not in' after a value")
        name = self.field()
        self.skip()
        op = next((o for o in _OPERATORS if self.text.startswith(o, self.pos)), None)
        if op is None:
            return self.node(start, "?", name)
        self.pos += len(op)
        if op in ("=~", "!~"):
            leaf = self.node(start, "=~", name, self.regex())
        elif op in ("=*", "!*"):
            self.skip()
            if not self.text.startswith(("'", '"'), self.pos):
                raise self.error(f"{op} takes a quoted glob pattern")
            leaf = _glob(self, start, name, self.string())
        else:
            return self.node(start, _BINARY[op], name, self.value())
        return self.node(start, "!", leaf) if op[0] == "!" else leaf

    def field_pos(self) -> int:
        self.skip()
        return self.pos

    def field(self) -> str:
        word = self.word()
        if word is None or word in _KEYWORDS:
            raise self.error("expected a field name")
        self.pos += len(word)
        return word

    def value(self) -> Any:
        self.skip()
        if self.text.startswith(("'", '"'), self.pos):
            return self.string()
        word = self.word()
        if word in ("true", "false"):
            self.pos += len(word)
            return word == "true"
        match = _NUMBER.match(self.text, self.pos)
        if match is None:
            raise self.error("expected a value: a number, a quoted string, true or false")
        digits = match.group()
        if len(digits) > MAX_DIGITS:
            raise self.error(f"a number of more than {MAX_DIGITS} characters")
        self.pos = match.end()
        if match.group(1) or match.group(2):
            number = float(digits)
            if number in (float("inf"), float("-inf")):
                raise self.error("a number beyond the range of a double", match.start())
            return number
        return int(digits)

    def string(self) -> str:
        quote, start = self.text[self.pos], self.pos
        out: list[str] = []
        self.pos += 1
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == quote:
                self.pos += 1
                return "".join(out)
            if char == "\\" and self.pos + 1 < len(self.text):
                self.pos += 1
                char = self.text[self.pos]
            out.append(char)
            self.pos += 1
        raise self.error("unterminated string", start)

    def regex(self) -> str:
        self.skip()
        start = self.pos
        if self.text.startswith("m", self.pos):
            self.pos += 1
        delimiter = self.text[self.pos : self.pos + 1]
        if not delimiter or delimiter not in _REGEX_DELIMITERS:
            raise self.error("expected a regex such as m/pattern/ (delimiters / # ^ |)")
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.text) and self.text[self.pos] != delimiter:
            pair = self.text[self.pos : self.pos + 2]
            if pair[0] == "\\" and len(pair) == 2:
                out.append(delimiter if pair[1] == delimiter else pair)
                self.pos += 2
            else:
                out.append(pair[0])
                self.pos += 1
        if self.pos >= len(self.text):
            raise self.error("unterminated regex", start)
        self.pos += 1
        flags = re.match(r"[A-Za-z]*", self.text[self.pos :])
        for offset, flag in enumerate(flags.group() if flags else ""):
            if flag == "i":
                raise self.error(
                    "regex flag 'i' is not supported: filters are case-sensitive",
                    self.pos + offset,
                )
            if flag != "s":
                raise self.error(f"unknown regex flag {flag!r} (only 's')", self.pos + offset)
        self.pos += len(flags.group()) if flags else 0
        return "".join(out)


# Each '*' is an unbounded quantifier: as many as the regex bound's product allows.
MAX_GLOB_STARS = next(n for n in itertools.count() if UNBOUNDED_CHOICES ** (n + 1) > MAX_CHOICES)


def _glob(parser: _Parser, start: int, name: str, pattern: str) -> list[Any]:
    """Ganeti's DNS-name glob, as two regexes (see the module docstring)."""
    if pattern.count("*") > MAX_GLOB_STARS:
        raise parser.error(
            f"glob {pattern[:60]!r} for field {name!r} has {pattern.count('*')} '*': at most "
            f"{MAX_GLOB_STARS} (more cannot be matched in bounded time)",
            start,
        )
    body = "".join(
        "[^.]*" if c == "*" else "[^.]" if c == "?" else "\\" + c if c in _GLOB_SPECIAL else c
        for c in pattern
    )
    # Said of the glob as typed: the regexes it becomes are no text the user wrote.
    if not pattern:
        raise parser.error(f'glob for field {name!r} is empty: compare with == "" instead', start)
    if len(body) + 3 > MAX_LENGTH:  # "^", "$" or "\\." around it
        raise parser.error(
            f"glob {pattern[:60]!r} for field {name!r} is too long: its regex would be "
            f"{len(body) + 3} characters, at most {MAX_LENGTH}",
            start,
        )
    whole = parser.node(start, "=~", name, f"^{body}$")
    # Unanchored at its end: what follows the dot is anything, with no quantifier.
    dotted = parser.node(start, "=~", name, f"^{body}\\.")
    return parser.node(start, "|", whole, dotted)


def _walk(raw: Any, depth: int = 1) -> Iterator[tuple[list[Any], int]]:
    yield raw, depth
    if raw and raw[0] in ("&", "|", "!"):
        for child in raw[1:]:
            yield from _walk(child, depth + 1)


def _check(resource: str, raw: Any, columns: dict[int, int]) -> None:
    """The tree's checks, each error placed at the column of the term it is about."""
    for count, (node, depth) in enumerate(_walk(raw), start=1):
        column = columns.get(id(node), 1)
        if depth > MAX_DEPTH:
            raise TextFilterError(
                column, f"nested deeper than {MAX_DEPTH} levels", "filter_too_deep"
            )
        if count > MAX_TERMS:
            raise TextFilterError(column, f"more than {MAX_TERMS} operators", "filter_too_large")
        if node[0] not in ("&", "|", "!"):
            try:
                parse(resource, node)
            except FilterError as exc:
                raise TextFilterError(column, _reason(exc), exc.code) from None


def _reason(exc: FilterError) -> str:
    return str(exc).removeprefix("filter: ")


def to_text(raw: Any) -> str:
    """The text form of an S-expression (``None`` is the empty filter, ``true``)."""
    if raw is None:
        return "true"
    op, args = raw[0], raw[1:]
    if op in ("&", "|"):
        if not args:
            return "true" if op == "&" else "false"
        if len(args) == 1:
            return to_text(args[0])
        word = " and " if op == "&" else " or "
        return word.join(_operand(a) for a in args)
    if op == "!":
        return "not " + _operand(args[0])
    if op == "?":
        return args[0]
    if op == "=~":
        return f"{args[0]} =~ {_regex_text(args[1])}"
    if op == "=[]":
        return f"{_value_text(args[1])} in {args[0]}"
    shown = "==" if op == "=" else op
    return f"{args[0]} {shown} {_value_text(args[1])}"


def _operand(raw: Any) -> str:
    text = to_text(raw)
    while raw[0] in ("&", "|") and len(raw) == 2:  # printed as its one term
        raw = raw[1]
    compound = raw[0] in ("&", "|") and len(raw) > 2
    return f"({text})" if compound else text


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _regex_text(pattern: str) -> str:
    free = next((d for d in _REGEX_DELIMITERS if d not in pattern), None)
    if free is not None:
        return f"m{free}{pattern}{free}"
    return "m/" + pattern.replace("/", "\\/") + "/"
