"""The syntax tree and parser of the portable regex subset (see ``regex``).

``Parser`` accepts exactly the subset's syntax and names what it refuses; ``regex``
adds the safety checks and the translations.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LENGTH = 255  # as the server list's regex filters (api.params): one bound for both APIs
MAX_COUNT = 16
MAX_CHOICES = 256 * 256
UNBOUNDED_CHOICES = 256
MAX_BOUNDED_CHOICES = 1024  # ways of the ? {m,n} and | of a pattern together: ten ?
_MAX_CODE = 0x10FFFF


class InvalidRegex(ValueError):
    """The pattern is outside the portable subset; the message says why."""


Ranges = tuple[tuple[int, int], ...]
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))
_SHORTHANDS = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r"}


@dataclass(frozen=True)
class Lit:
    char: str


@dataclass(frozen=True)
class Dot:
    pass


@dataclass(frozen=True)
class CharSet:
    ranges: Ranges
    negated: bool = False


@dataclass(frozen=True)
class Seq:
    items: tuple[Re, ...]


@dataclass(frozen=True)
class Alt:
    branches: tuple[Re, ...]


@dataclass(frozen=True)
class Repeat:
    item: Re
    min: int
    max: int | None  # None: unbounded


Re = Lit | Dot | CharSet | Seq | Alt | Repeat


@dataclass(frozen=True)
class Pattern:
    body: Re
    anchored_start: bool
    anchored_end: bool


class Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.top_level_alternation = False

    def fail(self, why: str) -> InvalidRegex:
        return InvalidRegex(f"regex {self.text!r}: {why} (at position {self.pos})")

    def peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def take(self) -> str:
        char = self.text[self.pos]
        self.pos += 1
        return char

    def alternation(self, *, top: bool = False) -> Re:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.take()
            branches.append(self.sequence())
        if top:
            # "(a|b)" parses to the same Alt as "a|b": remember which one this was
            self.top_level_alternation = len(branches) > 1
        return branches[0] if len(branches) == 1 else Alt(tuple(branches))

    def sequence(self) -> Re:
        items: list[Re] = []
        while (char := self.peek()) is not None and char not in "|)":
            items.append(self.quantified(self.atom()))
        if not items:
            raise self.fail("empty alternative or group")
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> Re:
        char = self.take()
        if char == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                raise self.fail("lookarounds, named groups and inline flags are not supported")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("unbalanced parenthesis")
            self.take()
            return inner
        if char == "[":
            return self.char_class()
        if char == ".":
            return Dot()
        if char == "\\":
            return self.escape(in_class=False)
        if char in "^$":
            raise self.fail(f"{char!r} is only allowed at the very start/end of the pattern")
        if char in "*+?{":
            raise self.fail(f"quantifier {char!r} has nothing to repeat")
        if char in ")]}":
            raise self.fail(f"unbalanced {char!r}")
        return Lit(char)

    def escape(self, *, in_class: bool) -> Re:
        if self.peek() is None:
            raise self.fail("trailing backslash")
        char = self.take()
        if char in _SHORTHANDS:
            return CharSet(_SHORTHANDS[char])
        if char.lower() in _SHORTHANDS and not in_class:
            return CharSet(_SHORTHANDS[char.lower()], negated=True)
        if char in _CONTROL_ESCAPES:
            return Lit(_CONTROL_ESCAPES[char])
        if char.isascii() and not char.isalnum():
            return Lit(char)
        if char.isdigit():
            raise self.fail("backreferences are not supported")
        raise self.fail(f"escape \\{char} is not supported")

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.take()
        ranges: list[tuple[int, int]] = []
        while True:
            char = self.peek()
            if char is None:
                raise self.fail("unterminated character class")
            if char == "]":
                self.take()
                break
            low = self.class_char()
            if isinstance(low, CharSet):
                ranges.extend(low.ranges)
                continue
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.take()
                high = self.class_char()
                if isinstance(high, CharSet) or ord(high) < ord(low):
                    raise self.fail("bad range in character class")
                ranges.append((ord(low), ord(high)))
            else:
                ranges.append((ord(low), ord(low)))
        if not ranges:
            raise self.fail("empty character class")
        return CharSet(_merge(ranges), negated)

    def class_char(self) -> str | CharSet:
        char = self.take()
        if char == "\\":
            escaped = self.escape(in_class=True)
            if isinstance(escaped, Lit):
                return escaped.char
            assert isinstance(escaped, CharSet)  # escape() makes nothing else
            return escaped
        if char == "[":
            raise self.fail("nested '[' in a character class: escape it as \\[")
        return char

    def quantified(self, item: Re) -> Re:
        char = self.peek()
        if char is None or char not in "*+?{":
            return item
        self.take()
        if char == "{":
            low, high = self.counts()
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        if (after := self.peek()) is not None and after in "*+?{":
            raise self.fail("lazy, possessive or stacked quantifiers are not supported")
        return Repeat(item, low, high)

    def counts(self) -> tuple[int, int | None]:
        end = self.text.find("}", self.pos)
        if end < 0:
            raise self.fail("unterminated {m,n}")
        spec, self.pos = self.text[self.pos : end], end + 1
        low_text, comma, high_text = spec.partition(",")
        # ASCII digits only: int() reads a fullwidth "2" as 2 and fails on "²" (isdigit takes both),
        # and the engines' regexes read either as a literal, not a count.
        if not _count(low_text) or (high_text and not _count(high_text)):
            raise self.fail(f"bad repetition {{{spec}}}")
        low = int(low_text)
        high = int(high_text) if high_text else (None if comma else low)
        if (high is not None and (high < low or high == 0)) or max(low, high or 0) > MAX_COUNT:
            raise self.fail(
                f"repetition {{{spec}}}: bounds must satisfy 0 <= m <= n, 1 <= n <= {MAX_COUNT}"
            )
        return low, high


def _count(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _merge(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return tuple(out)


def first_chars(node: Re) -> tuple[Ranges, bool]:
    """The characters a match of ``node`` can start with, and whether it can be empty."""
    if isinstance(node, Lit):
        return ((ord(node.char), ord(node.char)),), False
    if isinstance(node, Dot):
        return ((0, _MAX_CODE),), False
    if isinstance(node, CharSet):
        return (_complement(node.ranges) if node.negated else node.ranges), False
    if isinstance(node, Repeat):
        chars, empty = first_chars(node.item)
        return chars, empty or node.min == 0
    if isinstance(node, Alt):
        parts = [first_chars(b) for b in node.branches]
        return _merge([r for p in parts for r in p[0]]), any(p[1] for p in parts)
    chars_all: list[tuple[int, int]] = []
    for item in node.items:
        chars, empty = first_chars(item)
        chars_all.extend(chars)
        if not empty:
            return _merge(chars_all), False
    return _merge(chars_all), True


def _complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CODE:
        out.append((start, _MAX_CODE))
    return tuple(out)


def overlap(a: Ranges, b: Ranges) -> bool:
    return any(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in a for lo2, hi2 in b)


def children(node: Re) -> tuple[Re, ...]:
    if isinstance(node, Seq):
        return node.items
    if isinstance(node, Alt):
        return node.branches
    if isinstance(node, Repeat):
        return (node.item,)
    return ()


def walk(node: Re) -> list[Re]:
    return [node, *(n for child in children(node) for n in walk(child))]
