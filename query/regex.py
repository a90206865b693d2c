"""The portable regex subset of the API's regex filters, and its translations.

One pattern must match the same strings on every path: Lucene ``regexp`` (Elasticsearch,
OpenSearch), PostgreSQL ``~`` (ARE), MariaDB ``REGEXP`` (PCRE2) and Python ``re`` (the
SQLite ``REGEXP`` function). The subset is what all of them agree on, with each
difference pinned down by the translation:

* Syntax: literals, ``\\`` + punctuation, ``.``, classes ``[a-z_]``/``[^...]``,
  ``\\d \\w \\s`` (ASCII only: ``[0-9] [0-9A-Za-z_] [ \\t\\n\\r\\f\\v]``, everywhere),
  ``\\D \\W \\S`` outside classes, ``\\t \\n \\r``, groups ``(...)``/``(?:...)``,
  ``|``, and ``* + ? {m} {m,} {m,n}``.
* Unanchored unless it starts with ``^`` / ends with ``$`` (only there; not together
  with a top-level ``|``, whose branches would each need their own anchors).
* ``.`` and negated classes match any character, newline included (Lucene's meaning);
  ``$`` is the very end of the string (not before a final newline); case-sensitive.
* No backreferences, lookarounds, lazy/possessive quantifiers, inline flags, ``\\b``,
  or anything else one of the four engines lacks.

Backtracking engines (Python's, PCRE) go exponential on nested quantifiers (``(a+)+``)
and on alternatives that overlap under a quantifier (``(a|ab)*``), and polynomial on
runs of overlapping variable quantifiers (``a*a*a*b`` takes 0.7 s on 255 characters in
Python). Both kinds are rejected: the first structurally, the second by a budget on the
product of the choices the pattern offers (an unbounded quantifier counts 256, ``?``
2, ``{m,n}`` n-m+1, an alternation its branch count), so two unbounded quantifiers
pass and three do not. The bounded ones (``?``, ``{m,n}``, ``|``) cost the same on a
short value as on a long one, so they get a budget of their own, 1,024 (an alternation
whose branches start with different characters counts once: one is tried at each
place): sixteen ``.?`` before a literal passed the first and took ``re`` 3.4 ms on each
12-character name, a listing of 6,000 past every deadline (an adversarial probe).
Counted repetition is capped at 16 (``{m,n}``), which also keeps Lucene's determinized
automaton well inside Elasticsearch's state limit.

``matcher`` is how Python matches (the SQLite paths, the API's own evaluation): ``re``
where its worst case for the value's length stays under ``RE_STEPS`` (a name, for most
patterns), and an automaton in linear time otherwise (``regex_automaton``: a few
microseconds a name once its states are built), unless the pattern could make the
automaton build a state for nearly every character (``AUTOMATON_WILDCARDS``): then
``re`` up to ``SAFE_LENGTH``, as before either was chosen by cost.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from functools import lru_cache

from cellsight.query.regex_automaton import SAFE_LENGTH, Automaton
from cellsight.query.regex_syntax import (
    MAX_BOUNDED_CHOICES,
    MAX_CHOICES,
    MAX_LENGTH,
    UNBOUNDED_CHOICES,
    Alt,
    CharSet,
    Dot,
    InvalidRegex,
    Lit,
    Parser,
    Pattern,
    Ranges,
    Re,
    Repeat,
    Seq,
    children,
    first_chars,
    overlap,
    walk,
)

__all__ = [
    "InvalidRegex",
    "Matcher",
    "matcher",
    "parse",
    "to_lucene",
    "to_mariadb",
    "to_postgresql",
    "to_python",
    "validate",
]


def _check_safe(text: str, body: Re) -> None:
    for node in walk(body):
        if not isinstance(node, Repeat):
            continue
        inner = walk(node.item)
        if any(isinstance(n, Repeat) for n in inner):
            raise InvalidRegex(f"regex {text!r}: nested quantifiers (like (a+)+) are not allowed")
        if any(_branches_overlap(n) for n in inner if isinstance(n, Alt)):
            raise InvalidRegex(
                f"regex {text!r}: alternatives under a quantifier must start with "
                "different characters (like (ab|cd)*, not (a|ab)*)"
            )
    unbounded, bounded = _ways(body)
    if UNBOUNDED_CHOICES**unbounded * bounded > MAX_CHOICES:
        raise InvalidRegex(
            f"regex {text!r}: too many variable quantifiers and alternatives to match "
            "safely (at most two unbounded quantifiers such as .* or +)"
        )
    if bounded > MAX_BOUNDED_CHOICES:
        raise InvalidRegex(
            f"regex {text!r}: too many optional or counted quantifiers and alternatives to "
            f"match safely (at most {MAX_BOUNDED_CHOICES} combinations, such as ten ?)"
        )


def _branches_overlap(alt: Alt) -> bool:
    """Whether two of the alternation's branches can start with the same character."""
    firsts = [first_chars(b)[0] for b in alt.branches]
    return any(overlap(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1 :])


def _ways(body: Re) -> tuple[int, int]:
    """How many unbounded quantifiers the pattern has, and the product of the choices
    of its bounded ones and alternations."""
    unbounded, bounded = 0, 1
    for node in walk(body):
        if isinstance(node, Repeat) and node.max is None:
            unbounded += 1
        else:
            bounded *= _choices(node)
    return unbounded, bounded


def _re_up_to(body: Re) -> int:
    """The longest value (at most ``SAFE_LENGTH``) on which ``re`` takes at most
    ``RE_STEPS`` steps, bounded by each start, times each unbounded quantifier's
    possible lengths, times the bounded choices; -1 if none. ``SAFE_LENGTH`` for a
    pattern whose automaton may meet too many states (``_counted_wildcards``)."""
    if _counted_wildcards(body) > AUTOMATON_WILDCARDS:
        return SAFE_LENGTH
    unbounded, bounded = _ways(body)
    length = -1
    while length < SAFE_LENGTH and (length + 2) ** (unbounded + 1) * bounded <= RE_STEPS:
        length += 1
    return length


def _choices(node: Re) -> int:
    if isinstance(node, Alt):
        # Branches that start with different characters: one is tried at each place.
        empty = any(first_chars(b)[1] for b in node.branches)
        return 1 if not empty and not _branches_overlap(node) else len(node.branches)
    if isinstance(node, Repeat) and node.max != node.min:
        return UNBOUNDED_CHOICES if node.max is None else node.max - node.min + 1
    return 1


def _counted_wildcards(node: Re) -> int:
    """Characters a bounded repeat may have matched so far with a class or ``.``: the
    automaton's states are sets of such places, up to two to this power."""
    if isinstance(node, Repeat) and node.max is not None:
        return node.max * sum(isinstance(n, Dot | CharSet) for n in walk(node.item))
    return sum(_counted_wildcards(child) for child in children(node))


AUTOMATON_WILDCARDS = 8
"""Past this many (``_counted_wildcards``) the automaton can build a state for nearly
every character (``a.{8}.{8}b.*c``: 1.1 ms a 255-character value on average, 19 ms at
worst), so such a pattern keeps ``re`` on every value up to ``SAFE_LENGTH``, whose
worst case the budgets above bound (a review measured ``re`` 0.007 ms where the
automaton took 0.8-2.7)."""

RE_STEPS = 20_000
"""The most steps ``re`` may take on one value (about a millisecond at worst); past that
``Matcher`` takes the automaton."""


def parse(text: str) -> Pattern:
    """The checked syntax tree of a pattern; ``InvalidRegex`` says what is wrong."""
    if not isinstance(text, str):
        raise InvalidRegex(f"regex must be a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise InvalidRegex(f"regex is {len(text)} characters long; at most {MAX_LENGTH}")
    start = text.startswith("^")
    end = text.endswith("$") and not _escaped_at(text, len(text) - 1)
    inner = text[1 if start else 0 : len(text) - 1 if end else len(text)]
    if not inner:
        raise InvalidRegex(f"regex {text!r} is empty: compare with == instead")
    parser = Parser(inner)
    body = parser.alternation(top=True)
    if parser.pos != len(inner):
        raise parser.fail("unbalanced ')'")
    if parser.top_level_alternation and (start or end):
        raise InvalidRegex(
            f"regex {text!r}: anchors with a top-level '|' are ambiguous; group it: ^(a|b)$"
        )
    _check_safe(text, body)
    return Pattern(body, start, end)


def _escaped_at(text: str, index: int) -> bool:
    slashes = len(text[:index]) - len(text[:index].rstrip("\\"))
    return slashes % 2 == 1


def validate(pattern: str) -> str:
    """``pattern`` unchanged if it is in the portable subset, else ``InvalidRegex``."""
    parse(pattern)
    return pattern


# Translation --------------------------------------------------------------------


def _lit(char: str) -> str:
    # Backslash + ASCII punctuation is a literal in all four syntaxes; it also covers
    # Lucene's optional operators (@ & < > ~ #) and its quote ("), whatever the flags.
    if char.isascii() and not char.isalnum() and 0x20 <= ord(char) < 0x7F:
        return "\\" + char
    return char


def _class(ranges: Ranges, negated: bool) -> str:
    parts = [_lit(chr(lo)) if lo == hi else f"{_lit(chr(lo))}-{_lit(chr(hi))}" for lo, hi in ranges]
    return "[" + ("^" if negated else "") + "".join(parts) + "]"


def _emit(node: Re) -> str:
    if isinstance(node, Lit):
        return _lit(node.char)
    if isinstance(node, Dot):
        return "."
    if isinstance(node, CharSet):
        return _class(node.ranges, node.negated)
    if isinstance(node, Alt):
        return "|".join(_emit(b) for b in node.branches)
    if isinstance(node, Seq):
        return "".join(f"({_emit(i)})" if isinstance(i, Alt) else _emit(i) for i in node.items)
    item = _emit(node.item)
    if isinstance(node.item, Seq | Alt):
        item = f"({item})"
    if (node.min, node.max) == (0, None):
        return item + "*"
    if (node.min, node.max) == (1, None):
        return item + "+"
    if (node.min, node.max) == (0, 1):
        return item + "?"
    if node.max is None:
        return f"{item}{{{node.min},}}"
    if node.min == node.max:
        return f"{item}{{{node.min}}}"
    return f"{item}{{{node.min},{node.max}}}"


def to_lucene(pattern: str) -> str:
    """Lucene ``regexp`` (always anchored to the whole value): the open ends get ``.*``."""
    p = parse(pattern)
    return (
        ("" if p.anchored_start else ".*") + f"({_emit(p.body)})" + ("" if p.anchored_end else ".*")
    )


def to_postgresql(pattern: str) -> str:
    """PostgreSQL ARE for ``~``: ``.`` and ``$`` already have the subset's meaning."""
    p = parse(pattern)
    return (
        ("^" if p.anchored_start else "") + f"({_emit(p.body)})" + ("$" if p.anchored_end else "")
    )


def to_mariadb(pattern: str) -> str:
    """PCRE2 for MariaDB ``REGEXP``: dot-all, case-sensitive, no multiline/extended
    (whatever ``default_regex_flags`` says), ``\\z`` for the very end."""
    p = parse(pattern)
    return (
        "(?s-imx)"
        + ("^" if p.anchored_start else "")
        + f"({_emit(p.body)})"
        + ("\\z" if p.anchored_end else "")
    )


def to_python(pattern: str) -> str:
    """Python ``re`` (``search``): dot-all, ``\\A``/``\\Z`` anchors."""
    return _python(parse(pattern))


def _python(p: Pattern) -> str:
    return (
        "(?s)"
        + ("\\A" if p.anchored_start else "")
        + f"(?:{_emit(p.body)})"
        + ("\\Z" if p.anchored_end else "")
    )


class Matcher:
    """Whether a validated pattern matches in a value (``re.search``'s answer), in time
    bounded by the value's length: ``re`` up to the length where its worst case for this
    pattern reaches ``RE_STEPS`` (at most ``SAFE_LENGTH``), the automaton past it."""

    def __init__(self, pattern: str) -> None:
        self._parsed = parse(pattern)
        self._search = re.compile(_python(self._parsed)).search
        self.re_up_to = _re_up_to(self._parsed.body)  # longest value for ``re``
        # One automaton per thread: it builds its states as it meets them, and the
        # fan-out's cells and the API's requests match on threads of their own.
        self._local = threading.local()

    def __call__(self, value: str, check: Callable[[], None] | None = None) -> bool:
        """``check`` runs between blocks of a long value's characters and may raise."""
        if len(value) <= self.re_up_to:
            return self._search(value) is not None
        automaton: Automaton | None = getattr(self._local, "automaton", None)
        if automaton is None:
            automaton = self._local.automaton = Automaton(self._parsed)
        return automaton.search(value, check)


# Shared by every request: at least the operators one query v2 filter may hold
# (``sexpr.MAX_TERMS``), since a filter of more distinct patterns than it holds compiled
# each of them again for every document (a probe). Filters of that many patterns at
# once still evict each other's; a ``Matcher`` holds an automaton per thread using it.
@lru_cache(maxsize=1024)
def matcher(pattern: str) -> Matcher:
    """The ``Matcher`` of ``pattern`` (``InvalidRegex`` outside the subset)."""
    return Matcher(pattern)
