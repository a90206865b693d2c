"""A linear-time matcher of the portable regex subset, for values too long for ``re``.

``regex`` bounds a pattern's backtracking for values of up to ``SAFE_LENGTH``
characters (a name): two unbounded quantifiers cost ``re`` the cube of the length at
worst, which is milliseconds there and hours on a 64 KiB description (``a*a*b`` on
4,000 ``a`` took Python 17 s). Past that length the same pattern runs here instead:
Thompson's construction, simulated one character at a time with the sets of states met
remembered (a lazily built DFA, as RE2 does), so the time is linear in the value
and the caller's ``check`` runs between blocks of characters (a statement's deadline).
Lucene and PostgreSQL match by automata too; the answers are ``re``'s (the tests
compare them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from cellsight.query.regex_syntax import (
    Alt,
    CharSet,
    Dot,
    Lit,
    Pattern,
    Ranges,
    Re,
    Repeat,
    Seq,
)

SAFE_LENGTH: Final = 256
"""Values up to this long go to ``re`` (its worst case is bounded for them by ``regex``'s
checks); longer ones to the automaton."""

CHECK_EVERY: Final = 4096
MAX_CACHED: Final = 65536  # remembered transitions; cleared past it (memory stays bounded)

_MATCH = -1
Test = tuple[Ranges, bool] | None  # a consuming state's characters; None: any


def _accepts(test: Test, code: int) -> bool:
    if test is None:
        return True
    ranges, negated = test
    inside = any(lo <= code <= hi for lo, hi in ranges)
    return inside is not negated


class Automaton:
    """The NFA of one pattern, and the DFA states it has met so far. Not for two threads
    at once (``regex.Matcher`` keeps one a thread)."""

    def __init__(self, pattern: Pattern) -> None:
        self.anchored_start = pattern.anchored_start
        self.anchored_end = pattern.anchored_end
        self._tests: list[Test] = []  # per consuming state
        self._next: list[int] = []  # where a consuming state goes on its character
        self._splits: dict[int, list[int]] = {}  # epsilon states (numbered < -1)
        start = self._build(pattern.body, _MATCH)
        self._start = self._closure([start])
        self._sets: dict[frozenset[int], int] = {}
        self._members: list[frozenset[int]] = []
        self._moves: dict[tuple[int, str], int] = {}
        self._initial = self._intern(self._start)

    # Construction ---------------------------------------------------------------
    def _consume(self, test: Test, then: int) -> int:
        self._tests.append(test)
        self._next.append(then)
        return len(self._tests) - 1

    def _split(self, targets: list[int]) -> int:
        state = -2 - len(self._splits)
        self._splits[state] = targets
        return state

    def _build(self, node: Re, then: int) -> int:
        """The state that matches ``node`` and goes on to ``then`` (built backwards)."""
        if isinstance(node, Lit):
            code = ord(node.char)
            return self._consume((((code, code),), False), then)
        if isinstance(node, Dot):
            return self._consume(None, then)
        if isinstance(node, CharSet):
            return self._consume((node.ranges, node.negated), then)
        if isinstance(node, Seq):
            for item in reversed(node.items):
                then = self._build(item, then)
            return then
        if isinstance(node, Alt):
            return self._split([self._build(b, then) for b in node.branches])
        assert isinstance(node, Repeat)
        if node.max is None:
            loop = self._split([])
            self._splits[loop] = [self._build(node.item, loop), then]
            then = loop
        else:
            for _ in range(node.max - node.min):
                then = self._split([self._build(node.item, then), then])
        for _ in range(node.min):
            then = self._build(node.item, then)
        return then

    def _closure(self, states: list[int]) -> frozenset[int]:
        """The consuming states (and ``_MATCH``) reached from ``states`` without input."""
        seen: set[int] = set()
        out: set[int] = set()
        stack = list(states)
        while stack:
            state = stack.pop()
            if state in seen:
                continue
            seen.add(state)
            if state < _MATCH:
                stack.extend(self._splits[state])
            else:
                out.add(state)
        return frozenset(out)

    # Simulation -----------------------------------------------------------------
    def _intern(self, states: frozenset[int]) -> int:
        found = self._sets.get(states)
        if found is None:
            found = self._sets[states] = len(self._members)
            self._members.append(states)
        return found

    def _move(self, current: int, char: str) -> int:
        code = ord(char)
        reached = [
            self._next[s]
            for s in self._members[current]
            if s != _MATCH and _accepts(self._tests[s], code)
        ]
        states = self._closure(reached)
        if not self.anchored_start:
            states |= self._start  # a match may begin at the next character too
        if len(self._moves) >= MAX_CACHED or len(self._members) >= MAX_CACHED:
            # Together: a remembered move names states by their number.
            self._moves.clear()
            self._sets.clear()
            self._members.clear()
            self._initial = self._intern(self._start)
            return self._intern(states)
        target = self._moves[(current, char)] = self._intern(states)
        return target

    def search(self, text: str, check: Callable[[], None] | None = None) -> bool:
        """Whether the pattern matches in ``text`` (``re.search``'s answer); ``check``
        runs every ``CHECK_EVERY`` characters and may raise to stop."""
        current = self._initial
        members, moves = self._members, self._moves
        if not self.anchored_end and _MATCH in members[current]:
            return True
        for at, char in enumerate(text):
            if check is not None and at % CHECK_EVERY == CHECK_EVERY - 1:
                check()
            step = moves.get((current, char))
            if step is None:
                step = self._move(current, char)
                members, moves = self._members, self._moves
            current = step
            states = members[current]
            if not self.anchored_end and _MATCH in states:
                return True
            if not states:
                return False  # anchored at the start and nothing left to follow
        return _MATCH in members[current]
