"""Ganeti's human-readable filter syntax: the grammar, the round trip from every generated
S-expression, each error's column, hostile text, and the ``?filter=`` text over HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.api.headers import PATH
from cellsight.api.query2.evaluate import evaluate
from cellsight.api.query2.sexpr import MAX_DEPTH, parse_filter
from cellsight.api.query2.text import MAX_TEXT, TextFilterError, parse_text, to_sexpr, to_text
from tests.api.test_query2_http import ALL, filters
from tests.support.query2_filters import depth
from tests.support.query2_filters import filters as generated
from tests.support.query2_world import ADMIN, Pair, expected_uuids, query


def canonical(raw: Any) -> Any:
    """The one S-expression of each text: ``=`` is ``==``; a one-term and/or is its term."""
    op = raw[0]
    if op in ("&", "|", "!"):
        children = [canonical(c) for c in raw[1:]]
        if op != "!" and len(children) == 1:
            return children[0]
        return [op, *children]
    return ["==", *raw[1:]] if op == "=" else raw


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('name == "web"', ["==", "name", "web"]),
        ("progress = 5", ["==", "progress", 5]),
        ("progress != -5", ["!=", "progress", -5]),
        ("progress<+5", ["<", "progress", 5]),
        ("progress <= 5", ["<=", "progress", 5]),
        ("progress > 5", [">", "progress", 5]),
        ("progress >= 5", [">=", "progress", 5]),
        ("'a' in tags", ["=[]", "tags", "a"]),
        ('"a" not in tags', ["!", ["=[]", "tags", "a"]]),
        ("name =~ m/^w/", ["=~", "name", "^w"]),
        ("name =~ #a/b#s", ["=~", "name", "a/b"]),
        ("name !~ m|x\\|y|", ["!", ["=~", "name", "x|y"]]),
        ("name =~ m/web-\\d/", ["=~", "name", "web-\\d"]),
        ("locked", ["?", "locked"]),
        ("locked == false", ["==", "locked", False]),
        ("flavor_rxtx_factor > 1.5e3", [">", "flavor_rxtx_factor", 1500.0]),
        ('name == "a\\"b\\\\c"', ["==", "name", 'a"b\\c']),
        ("true", ["&"]),
        ("false", ["|"]),
        # not > and > or; and/or are n-ary at one level, as Ganeti's infix notation.
        ("locked or not locked and progress == 1 or key_name", [
            "|", ["?", "locked"],
            ["&", ["!", ["?", "locked"]], ["==", "progress", 1]],
            ["?", "key_name"],
        ]),
        ("not (locked or key_name) and (progress == 1)", [
            "&", ["!", ["|", ["?", "locked"], ["?", "key_name"]]], ["==", "progress", 1],
        ]),
        ("not not locked", ["!", ["!", ["?", "locked"]]]),
        ("android", ["?", "android"]),  # a keyword only as a whole word
    ],
)  # fmt: skip
def test_grammar(text: str, want: Any) -> None:
    assert to_sexpr(text)[0] == want


def test_glob_is_ganetis_dns_name_glob() -> None:
    raw = to_sexpr('name =* "web?.*"')[0]
    assert raw == [
        "|",
        ["=~", "name", "^web[^.]\\.[^.]*$"],
        ["=~", "name", "^web[^.]\\.[^.]*\\."],
    ]
    assert to_sexpr('name !* "a"')[0][0] == "!"
    docs = [{"display_name": n} for n in ("web1.x", "web1.x.site", "web12.x", "web1", "web1.xy")]
    tree = parse_text("instance", 'name =* "web?.x"').tree
    assert [d["display_name"] for d in docs if evaluate(tree, d)] == ["web1.x", "web1.x.site"]


def test_a_glob_takes_two_stars_and_names_a_third() -> None:
    """Each ``*`` is an unbounded quantifier and the regex bound allows two: ``*-*``
    (refused before, by the dotted regex's own ``.*``) is read; a third is refused
    naming the glob, where the error quoted a regex the user never wrote (a probe)."""
    docs = [{"display_name": n} for n in ("web-1", "web-1.site", "web1", "db-2.x.y")]
    tree = parse_text("instance", 'name =* "*-*"').tree
    assert [d["display_name"] for d in docs if evaluate(tree, d)] == [
        "web-1", "web-1.site", "db-2.x.y"
    ]  # fmt: skip
    with pytest.raises(TextFilterError, match=r"glob '\*-\*-\*' for field 'name' has 3"):
        parse_text("instance", 'name =* "*-*-*"')


def test_an_empty_or_overlong_glob_is_named_as_typed() -> None:
    """The errors quoted the regex a glob became (``regex '^$' is empty``), a text the
    user never wrote (a probe)."""
    with pytest.raises(TextFilterError, match="glob for field 'name' is empty") as empty:
        parse_text("instance", 'name =* ""')
    assert "^$" not in str(empty.value)
    long = "a." * 90  # its regex escapes every dot: longer than the glob
    assert len(long) < 255
    with pytest.raises(TextFilterError, match="is too long: its regex would be 273") as err:
        parse_text("instance", f'name =* "{long}"')
    assert "glob 'a.a.a" in str(err.value)
    assert parse_text("instance", f'name =* "{"a." * 84}"').tree is not None  # 255: fits


_resource_and_filter = st.sampled_from(["instance", "node"]).flatmap(
    lambda r: st.tuples(st.just(r), generated(r))
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(case=_resource_and_filter)
def test_every_generated_filter_round_trips(case: tuple[str, Any]) -> None:
    resource, raw = case
    text = to_text(raw)
    assert to_sexpr(text)[0] == canonical(raw)
    if depth(raw) > MAX_DEPTH:
        with pytest.raises(TextFilterError):
            parse_text(resource, text)
        return
    assert parse_text(resource, text).tree == parse_filter(resource, raw)


@pytest.mark.parametrize(
    ("text", "column", "words"),
    [
        ("", 1, "expected a condition"),
        ("nmae == 1", 1, "unknown instance field 'nmae'"),
        ('locked and nmae == "x"', 12, "'nmae'"),
        ('"x" in nmae', 8, "'nmae'"),
        ("progress == ", 13, "expected a value"),
        ('progress == "x"', 1, "'progress' takes a number"),
        ('name == "x', 9, "unterminated string"),
        ("name =~ m/x", 9, "unterminated regex"),
        ("name =~ x", 9, "expected a regex"),
        ("name =~ m/x/i", 13, "flag 'i'"),
        ("name =~ m/x/q", 13, "unknown regex flag 'q'"),
        ("name =~ m/(a+)+/", 1, "bad regex for field 'name'"),
        ("name =* web", 9, "quoted glob"),
        ("locked and", 11, "expected a condition"),
        ("(locked", 8, "expected ')'"),
        ("locked)", 7, "expected 'and', 'or'"),
        ("5 tags", 3, "expected 'in'"),
        ('"x" not tags', 9, "expected 'in' after 'not'"),
        ('"x" in and', 8, "expected a field name"),
        ("progress > 1 and progress == 1 and 'x' in name", 43, "=[] needs a list"),
        ("locked < true", 1, "< does not apply to bool field 'locked'"),
        ("progress == " + "9" * 500, 13, "more than 400 characters"),
        ("flavor_rxtx_factor == 1e999", 23, "beyond the range of a double"),
        ("(" * 50 + "locked" + ")" * 50, 41, "nested deeper"),
        ("not " * 50 + "locked", 161, "nested deeper"),
        ("not " * 12 + "locked", 41, f"nested deeper than {MAX_DEPTH}"),
        ("x" * (MAX_TEXT + 1), MAX_TEXT + 1, "longer than"),
    ],
)
def test_each_error_names_its_column(text: str, column: int, words: str) -> None:
    with pytest.raises(TextFilterError) as caught:
        parse_text("instance", text)
    assert caught.value.column == column
    assert str(caught.value).startswith(f"filter: column {column}: ")
    assert words in str(caught.value)


def test_too_many_terms_names_the_column_of_the_first_one_over() -> None:
    text = " or ".join(["locked"] * 1000)
    with pytest.raises(TextFilterError) as caught:
        parse_text("instance", text)
    # The or itself is term 1, so the 1000th "locked" is term 1001.
    assert caught.value.column == 1 + 999 * len("locked or ")
    assert caught.value.code == "filter_too_large"


_hostile = st.one_of(
    st.text(max_size=200),
    st.text(alphabet="()notandor \"'\\/m=~!*<>in0123456789-+.e", max_size=300),
    st.builds(lambda n, t: "(" * n + t + ")" * n, st.integers(0, 5000), st.text(max_size=5)),
    st.builds(lambda n: "not " * n + "locked", st.integers(0, 5000)),
    st.builds(lambda n: "progress == " + "7" * n, st.integers(1, 5000)),
    st.just("x" * 1_000_000),
    st.just('name == "' + "é" * 500_000 + '"'),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_hostile)
def test_any_text_parses_or_fails_with_a_column(text: str) -> None:
    try:
        parse_text("instance", text)
    except TextFilterError as exc:
        assert 1 <= exc.column <= len(text) + 1
        assert str(exc).startswith(f"filter: column {exc.column}: ")


# Over HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label", ["==", "!=", "<", ">=", "=~", "=[]", "?", "!", "&", "|", "status"]
)
def test_text_filter_over_http_equals_the_json_form(
    pair: Pair, docs: list[dict[str, Any]], label: str
) -> None:
    raw = filters(docs)[label]
    text = to_text(raw)
    want = expected_uuids("instance", docs, raw)
    assert want
    for client, path in ((pair.index, "index"), (pair.fanout, "fanout")):
        by_json = query(client, "instance", {"fields": ALL, "filter": raw})
        by_text = query(client, "instance", {"fields": ALL, "filter": text})
        by_get = client.get(
            "/v2.1/query/instance", params={"fields": ",".join(ALL), "filter": text}, headers=ADMIN
        )
        for response in (by_json, by_text, by_get):
            assert response.status_code == 200, response.text
            assert response.headers[PATH] == path
        assert by_text.json() == by_json.json() == by_get.json()
        assert [row[0][1] for row in by_get.json()["data"]] == want


def test_bad_text_over_http_is_a_400_naming_the_column(pair: Pair) -> None:
    for client in pair.both():
        got = client.get(
            "/v2.1/query/instance",
            params={"fields": "uuid", "filter": "locked and nmae"},
            headers=ADMIN,
        )
        assert got.status_code == 400
        message = got.json()["badRequest"]["message"]
        assert "column 12" in message and "'nmae'" in message
        posted = query(client, "node", {"fields": ["uuid"], "filter": "offline =="})
        assert posted.status_code == 400 and "column 11" in posted.json()["badRequest"]["message"]
        assert client.get("/v2.1/query/instance", headers=ADMIN).status_code == 400
        assert (
            client.get(
                "/v2.1/query/instance", params={"fields": "uuid", "bogus": "1"}, headers=ADMIN
            ).status_code
            == 400
        )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.text(max_size=80) | st.text(alphabet="()notandor \"'\\/m=~!*<>in0-9.", max_size=80))
def test_any_text_over_http_is_an_answer_or_a_400_never_a_500(pair: Pair, text: str) -> None:
    for client in pair.both():
        got = client.get(
            "/v2.1/query/instance", params={"fields": "uuid", "filter": text}, headers=ADMIN
        )
        assert got.status_code in (200, 400), got.text
        if got.status_code == 400:
            assert "column" in got.json()["badRequest"]["message"]
