"""The portable regex subset: what it rejects and why, how it translates, and that
Python, SQLite, PostgreSQL, MariaDB and osmem (Lucene syntax) agree on every match."""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cellsight.api.driver_errors import classify, is_cell_failure
from cellsight.cells.schema import TABLE_OPTIONS, Str
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.fields import DocField, Kind
from cellsight.query import regex, regex_automaton
from cellsight.query.dsl import compile_filter
from cellsight.query.regex_automaton import CHECK_EVERY, SAFE_LENGTH, Automaton
from cellsight.query.sql import regex_match
from cellsight.query.sqlite_regexp import Deadline, RegexDeadline, install, install_on_engine
from cellsight.query.tree import Regex


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("", "empty"),
        ("^$", "empty"),
        ("a" * 256, "at most 255"),
        ("(a+)+", "nested quantifiers"),
        ("(a*b?)*", "nested quantifiers"),
        ("(a|ab)*", "different characters"),
        ("(.|x)+", "different characters"),
        ("a*b*c*", "too many variable quantifiers"),
        # Sixteen optional dots passed, and took re 3.4 ms on each 12-character name: a
        # listing of 6,000 ran past every deadline (an adversarial probe).
        (".?" * 16 + "093", "too many optional or counted quantifiers"),
        (".?" * 11 + "x", "at most 1024 combinations"),
        ("[ab]{0,16}[ab]{0,16}[ab]{0,16}c", "too many optional or counted quantifiers"),
        ("(a|ab)" * 11, "too many optional or counted quantifiers"),  # both start with a
        (".*" + ".?" * 9, "too many variable quantifiers"),
        ("(a)\\1", "backreferences"),
        ("a(?=b)", "lookarounds"),
        ("a(?<!b)", "lookarounds"),
        ("(?i)a", "inline flags"),
        ("a*?", "lazy"),
        ("a++", "possessive"),
        ("a{2,40}", "repetition"),
        ("a{3,2}", "repetition"),
        # Unicode digits isdigit() takes: "²" reached int() (a bare ValueError in Python's
        # words), a fullwidth "2" counted as 2 where the engines read a literal.
        ("a{\u00b2}", "bad repetition"),
        ("a{\uff12}", "bad repetition"),
        ("a{1,\u00b2}", "bad repetition"),
        ("\\bword", "escape \\b"),
        ("a^b", "only allowed at the very start/end"),
        ("^a|b$", "top-level '|'"),
        ("[a", "unterminated"),
        ("a)", "unbalanced"),
        ("(a", "unbalanced"),
        ("*a", "nothing to repeat"),
        ("[z-a]", "bad range"),
        ("[\\D]", "escape \\D"),
        ("a|", "empty alternative"),
        ("\\", "trailing backslash"),
    ],
)
def test_patterns_outside_the_subset_are_rejected_saying_why(pattern: str, why: str) -> None:
    with pytest.raises(regex.InvalidRegex, match=re.escape(why)):
        regex.validate(pattern)


@pytest.mark.parametrize(
    ("pattern", "re_up_to"),
    [
        ("093", SAFE_LENGTH),  # re's worst case is the value's length
        ("[0-9]{1,3}\\.[0-9]{1,3}", SAFE_LENGTH),
        (".?" * 8 + "x", 77),  # 256 ways at each start: 78 * 256 steps at most
        ("d[0-9]+x", 140),  # one unbounded: (n + 1) ** 2
        (".*a.*b", 26),  # two: (n + 1) ** 3; the automaton past 26 characters
        # Sixteen places a counted . may have matched: the automaton's states could be
        # sets of them, one new for nearly every character (a review: 19 ms a value).
        ("a.{8}.{8}b.*c", SAFE_LENGTH),
    ],
)
def test_re_takes_only_the_values_its_worst_case_allows(pattern: str, re_up_to: int) -> None:
    """``re`` matches a value only where its worst case for the pattern stays within
    ``RE_STEPS``; longer values go to the automaton (a fixed 256 let sixteen ``.?`` cost
    3.4 ms a name)."""
    matches = regex.Matcher(pattern)
    assert matches.re_up_to == re_up_to
    search = re.compile(regex.to_python(pattern)).search
    for value in ("a" * re_up_to + "b", "093" * 90, "d12x" * 3, ("ab" * 300)[: re_up_to + 1]):
        assert matches(value) is (search(value) is not None)


@pytest.mark.parametrize(
    "pattern",
    [
        # Branches that start with different characters cost one try at each place.
        "^(prod|stage|dev|test)-(a|b|c|d)-(1|2|3|4)-(x|y|z|w)-(p|q)$",
        "^[a-z]{0,16}-[0-9]{0,16}$",
        ".?" * 10 + "x",
    ],
)
def test_patterns_within_the_budgets_are_accepted(pattern: str) -> None:
    assert regex.validate(pattern) == pattern


def test_invalid_regex_is_a_value_error() -> None:
    assert issubclass(regex.InvalidRegex, ValueError)


@pytest.mark.parametrize(
    ("pattern", "lucene"),
    [
        ("web", ".*(web).*"),
        ("^web", "(web).*"),
        ("web$", ".*(web)"),
        ('^a@b&c<d>e~f#g"h$', '(a\\@b\\&c\\<d\\>e\\~f\\#g\\"h)'),
        ("\\d+\\.\\w", ".*([0-9]+\\.[0-9A-Z\\_a-z]).*"),
        ("(?:ab|cd){1,2}", ".*((ab|cd){1,2}).*"),
    ],
)
def test_lucene_translation_anchors_and_escapes(pattern: str, lucene: str) -> None:
    assert regex.to_lucene(pattern) == lucene


def test_translations_pin_down_dot_end_and_case() -> None:
    assert regex.to_python("a.$") == "(?s)(?:a.)\\Z"
    assert regex.to_mariadb("^a") == "(?s-imx)^(a)"
    assert regex.to_postgresql("a$") == "(a)$"
    search = re.compile(regex.to_python("a.$")).search
    assert search("x\na\n") and not search("a\nb\n") and not search("A\n")


# Differential property ---------------------------------------------------------------

LITERALS = [
    "a", "b", "A", "1", "-", "é", "日", " ", ":", "_", "@", "&", "~", "#", '"', "<", ">",
    "\\.", "\\+", "\\*", "\\\\", "\\t", "\\n", "\\(", "\\[", "\\]", "\\^", "\\$", "\\|",
]  # fmt: skip
CLASSES = [
    "[ab]", "[^a]", "[a-c]", "[A-Za-z]", "[\\d.]", "[^\\s]", "[é日]", "[-a]", "[a\\]]",
    "[\\^b]", "[^-]", "\\d", "\\w", "\\s", "\\D", "\\W", "\\S", ".",
]  # fmt: skip
QUANTIFIERS = ["", "", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"]
ALPHABET = 'abA1-é日 :_@&~#"<>.+*\\\t\n()[]^$|xÉ'

atoms = st.sampled_from(LITERALS + CLASSES)
pieces = st.builds(lambda a, q: a + q, atoms, st.sampled_from(QUANTIFIERS))
plain = st.lists(atoms, min_size=1, max_size=3).map("".join)
groups = st.one_of(
    st.builds(lambda x, q: f"({x}){q}", plain, st.sampled_from(QUANTIFIERS)),
    st.builds(lambda x, y, q: f"(?:{x}|{y}){q}", plain, plain, st.sampled_from(QUANTIFIERS)),
    st.builds(lambda x, y: f"({x}|{y})", pieces.map(str), plain),
)
bodies = st.lists(st.one_of(pieces, groups), min_size=1, max_size=4).map("".join)
patterns = st.builds(
    lambda start, body, end: ("^" if start else "") + body + ("$" if end else ""),
    st.booleans(),
    bodies,
    st.booleans(),
)
CORPUS = ["", "a", "ab", "aab", "A", "b1", "é", "日本", "a b", "a\nb", "x.y", "-", "@&~#", "ab\n"]


@pytest.fixture(scope="module")
def regex_tables(
    query_cells: dict[str, sa.Engine],
) -> Iterator[dict[str, tuple[sa.Engine, sa.Table]]]:
    out = {}
    for dialect, engine in query_cells.items():
        meta = sa.MetaData()
        table = sa.Table(
            "rx_strings", meta, sa.Column("i", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("s", Str(255)), **TABLE_OPTIONS,
        )  # fmt: skip
        meta.drop_all(engine)
        meta.create_all(engine)
        out[dialect] = (engine, table)
    yield out
    for engine, table in out.values():
        table.drop(engine)


@pytest.fixture(scope="module")
def osmem_client(query_engines: dict[str, SearchEngine]) -> Any:
    client = query_engines["opensearch"].client  # type: ignore[attr-defined]
    mapping = {"properties": {"s": {"type": "keyword"}, "batch": {"type": "keyword"}}}
    client.indices.create(index="rx-strings", body={"mappings": mapping})
    return client


def _sql_matches(
    engine: sa.Engine, table: sa.Table, pattern: str, strings: list[str]
) -> list[bool]:
    with engine.begin() as conn:
        conn.execute(table.delete())
        conn.execute(table.insert(), [{"i": i, "s": s} for i, s in enumerate(strings)])
        hits = set(
            conn.scalars(
                sa.select(table.c.i).where(regex_match(table.c.s, pattern, conn.dialect.name))
            )
        )
    return [i in hits for i in range(len(strings))]


def _osmem_matches(client: Any, batch: str, pattern: str, strings: list[str]) -> list[bool]:
    lines: list[Any] = []
    for i, s in enumerate(strings):
        lines += [
            {"index": {"_index": "rx-strings", "_id": f"{batch}-{i}"}},
            {"s": s, "batch": batch},
        ]
    client.bulk(body=lines, refresh=True)
    query = compile_filter(Regex("s", pattern), {"s": DocField("s", Kind.KEYWORD)})
    body = {"query": {"bool": {"filter": [{"term": {"batch": batch}}, query]}}, "size": 100}
    hits = {h["_id"] for h in client.search(index="rx-strings", body=body)["hits"]["hits"]}
    return [f"{batch}-{i}" in hits for i in range(len(strings))]


def _sqlite_matches(pattern: str, strings: list[str]) -> list[bool]:
    conn = sqlite3.connect(":memory:")
    install(conn, Deadline())
    rows = conn.execute(
        "SELECT value REGEXP ? FROM json_each(?) ORDER BY key",
        (pattern, json.dumps(strings)),
    )
    return [bool(r[0]) for r in rows]


_batches = iter(range(10**9))


@pytest.mark.services
@settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(pattern=patterns, extra=st.lists(st.text(ALPHABET, max_size=6), max_size=6), data=st.data())
def test_every_engine_agrees_on_every_match(
    regex_tables: dict[str, tuple[sa.Engine, sa.Table]],
    osmem_client: Any,
    pattern: str,
    extra: list[str],
    data: Any,
) -> None:
    try:
        python = re.compile(regex.to_python(pattern))
    except regex.InvalidRegex:
        assume(False)
        return
    alphabet = st.characters(codec="utf-8", exclude_characters="\x00")
    matching = data.draw(st.lists(st.from_regex(python, alphabet=alphabet), max_size=3))
    strings = list(dict.fromkeys([s for s in CORPUS + extra + matching if len(s) < 60]))
    want = [python.search(s) is not None for s in strings]
    got = {"sqlite-fn": _sqlite_matches(pattern, strings)}
    for dialect, (engine, table) in regex_tables.items():
        got[dialect] = _sql_matches(engine, table, pattern, strings)
    got["osmem"] = _osmem_matches(osmem_client, str(next(_batches)), pattern, strings)
    for name, answer in got.items():
        wrong = [s for s, w, g in zip(strings, want, answer, strict=True) if w != g]
        assert not wrong, f"{name} disagrees with Python on {pattern!r} for {wrong!r}"


def test_a_regex_past_its_deadline_on_a_sqlite_cell_is_a_timeout(tmp_path: Path) -> None:
    """Found from outside: the fan-out named such a cell ``error`` (SQLite reports the
    function's exception as a plain OperationalError), not ``timeout``."""
    for timeout, expired in ((1e-9, True), (10.0, False)):
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'cell.db'}")
        install_on_engine(engine, timeout=timeout)
        query = sa.text("SELECT 'abc' REGEXP 'a' FROM (SELECT 1 UNION SELECT 2)")
        try:
            with engine.connect() as conn:
                if not expired:
                    assert conn.execute(query).scalars().all() == [1, 1]
                    continue
                with pytest.raises(RegexDeadline) as raised:
                    conn.execute(query)
            assert is_cell_failure(raised.value) and classify(raised.value) == "timeout"
        finally:
            engine.dispose()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns, data=st.data())
def test_the_automaton_answers_as_re_does(pattern: str, data: Any) -> None:
    """Values past a name's length are matched by the automaton, not ``re``: it must give
    ``re.search``'s answer on every value, short ones included (where ``re`` is safe)."""
    try:
        parsed = regex.parse(pattern)
    except regex.InvalidRegex:
        assume(False)
        return
    python = re.compile(regex.to_python(pattern))
    alphabet = st.characters(codec="utf-8", exclude_characters="\x00")
    matching = data.draw(st.lists(st.from_regex(python, alphabet=alphabet), max_size=3))
    extra = data.draw(st.lists(st.text(ALPHABET, max_size=12), max_size=6))
    automaton = Automaton(parsed)
    for value in dict.fromkeys(CORPUS + extra + [m for m in matching if len(m) < 200]):
        assert automaton.search(value) is (python.search(value) is not None), (pattern, value)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pattern=patterns,
    piece=st.text(ALPHABET, min_size=1, max_size=8),
    tail=st.text(ALPHABET, max_size=8),
    times=st.integers(SAFE_LENGTH // 8 + 1, 80),
)
def test_a_long_value_gets_the_answer_re_would_give(
    pattern: str, piece: str, tail: str, times: int
) -> None:
    """``matcher`` on a value past ``SAFE_LENGTH`` (the automaton's side of it), against
    ``re`` on the same value (at most 640 characters here: slow for ``re``, not hours)."""
    try:
        matches = regex.matcher(pattern)
    except regex.InvalidRegex:
        assume(False)
        return
    value = piece * times + tail
    assume(len(value) > SAFE_LENGTH)
    assert matches(value) is (re.search(regex.to_python(pattern), value) is not None)


@pytest.mark.parametrize("pattern", ["a*a*b", ".*.*b", "\\w*\\w*!", "[^b]*[^b]*b", "^a*a*b$"])
def test_a_64_kib_value_is_matched_in_linear_time_and_checked(pattern: str) -> None:
    """Found from outside: ``a*a*b`` passes the subset's checks (two unbounded
    quantifiers), and ``re`` took 17 s on a 4,000-character description (a text field
    holds 64 KiB); the deadline could not stop it. The automaton runs ``check`` between
    blocks of characters, so a deadline does."""
    value = "a" * 65535
    calls: list[int] = []

    def check() -> None:
        calls.append(1)

    matches = regex.matcher(pattern)
    assert matches(value, check) is False
    assert matches(value + "b!", check) is (pattern != "^a*a*b$")
    assert len(calls) >= 2 * (65535 // CHECK_EVERY) - 2

    def expired() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        matches(value, expired)


def test_the_automaton_forgets_its_states_past_its_bound_and_threads_share_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``a.{16}b$`` over random a/b meets tens of thousands of state sets; past
    ``MAX_CACHED`` they are forgotten. One automaton shared by threads gave IndexError and
    wrong answers when another cleared them mid-search (found by a review)."""
    monkeypatch.setattr(regex_automaton, "MAX_CACHED", 64)
    rng = random.Random(5)
    values = ["".join(rng.choice("ab") for _ in range(5000)) + tail for tail in ("", "b")]
    values += [v[:-18] + "a" + "b" * 17 for v in values]
    pattern = "a.{16}b$"
    want = [re.search(regex.to_python(pattern), v) is not None for v in values]
    assert True in want and False in want
    matches = regex.Matcher(pattern)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(matches, values * 8))
    assert got == want * 8
