"""Partial and odd ``changes-since``/``changes-before`` strings, generated: never a 500,
both paths give the same answer, and a value is accepted exactly when Nova's
``timeutils.parse_isotime`` (the ``iso8601`` library) accepts it, read as the same
instant.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import urlencode

import iso8601  # what oslo's parse_isotime calls
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from cellsight.api.change_times import MAX_DATE_LENGTH
from cellsight.api.headers import PATH
from tests.support.api_world import ADMIN, World, both_paths

LATEST = {"OpenStack-API-Version": "compute 2.96"}


def digits(low: int, high: int) -> st.SearchStrategy[str]:
    return st.text("0123456789", min_size=low, max_size=high)


def optional(part: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just(""), part)


SEP = st.sampled_from(["-", "", "--", "/"])
# Pieces of ISO 8601 dates, right and wrong, glued together: partial dates, basic and
# extended forms, odd separators, zones, fractions, stray characters.
near_dates = st.builds(
    lambda *parts: "".join(parts),
    st.one_of(digits(4, 4), digits(0, 6), st.sampled_from(["2025", "2024", "1970", "9999"])),
    optional(st.builds(str.__add__, SEP, digits(1, 3))),
    optional(st.builds(str.__add__, SEP, digits(1, 3))),
    optional(
        st.builds(
            lambda sep, hour, rest: sep + hour + rest,
            st.sampled_from(["T", " ", "t", "X", "TT"]),
            digits(1, 3),
            st.text(":0123456789", max_size=7),
        )
    ),
    optional(st.builds(str.__add__, st.sampled_from([".", ",", ":"]), digits(0, 8))),
    optional(
        st.one_of(
            st.sampled_from(["Z", "z", "+", "-", "+05", "-0330", "+05:", "+24:00", "+00:99"]),
            st.builds(str.__add__, st.sampled_from(["+", "-"]), st.text(":0123456789", max_size=5)),
        )
    ),
    optional(st.sampled_from(["\n", " ", "\t", "x", "\x00", "é", "٣"])),
)


def number(low: int, high: int, width: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(lambda n: str(n).zfill(width))


# Well-formed for the grammar (each part only after the one it needs), values mostly in
# range: what Nova accepts, partial or not, in every spelling iso8601 allows.
time_part = st.builds(
    lambda sep, hour, minute, second, zone: sep + hour + minute + second + zone,
    st.sampled_from(["T", " "]),
    number(0, 24, 2),
    optional(st.builds(str.__add__, st.sampled_from([":", ""]), number(0, 60, 2))),
    optional(
        st.builds(
            lambda colon, sec, frac: colon + sec + frac,
            st.sampled_from([":", ""]),
            st.one_of(number(0, 60, 2), number(0, 9, 1)),
            optional(st.builds(str.__add__, st.sampled_from([".", ","]), digits(1, 9))),
        )
    ),
    optional(
        st.one_of(
            st.just("Z"),
            st.builds(
                lambda sign, hours, colon, minutes: sign + hours + colon + minutes,
                st.sampled_from(["+", "-"]),
                number(0, 25, 2),
                st.sampled_from([":", ""]),
                optional(number(0, 99, 2)),
            ),
        )
    ),
)
day_part = st.builds(
    str.__add__,
    st.one_of(number(1, 32, 2), st.builds(str.__add__, st.just("-"), number(1, 31, 1))),
    optional(time_part),
)
well_formed = st.builds(
    lambda year, month, rest, tail: year + month + rest + tail,
    st.one_of(number(0, 9999, 4), st.sampled_from(["2025", "2024", "0001", "9999"])),
    optional(
        st.one_of(
            number(1, 13, 2),
            st.builds(str.__add__, st.just("-"), st.one_of(number(1, 12, 1), number(1, 12, 2))),
        )
    ),
    optional(day_part),
    optional(st.just("\n")),
)
odd_text = st.text(st.sampled_from("0123456789-:T Z+.,tzW\n"), max_size=30)
dates = st.one_of(well_formed, near_dates, odd_text)


def nova_reads(value: str) -> datetime | None:
    """What Nova's format checker accepts, in UTC; None for a 400. Cellsight adds its
    bounds (length, years 1-9999 once in UTC): a 400 where Nova would fail later."""
    try:
        parsed = iso8601.parse_date(value)
    except iso8601.ParseError:
        return None
    if len(value) > MAX_DATE_LENGTH:
        return None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


@pytest.fixture(scope="module")
def clients(
    sqlite_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestClient]]:
    with both_paths(sqlite_world, tmp_path_factory.mktemp("change-fuzz"), "cf") as clients:
        yield clients


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    param=st.sampled_from(["changes-since", "changes-before"]),
    values=st.lists(dates, min_size=1, max_size=2),
)
@example(param="changes-since", values=["2025-05"])
@example(param="changes-before", values=["2025"])
@example(param="changes-since", values=["x", "2025-05-01T00:00:00Z"])
def test_odd_dates_never_500_and_both_paths_agree(
    clients: dict[str, TestClient], param: str, values: list[str]
) -> None:
    query = urlencode([("limit", "1000"), ("all_tenants", "1")] + [(param, v) for v in values])
    answers = {}
    for path, client in clients.items():
        response = client.get(f"/v2.1/servers/detail?{query}", headers={**ADMIN, **LATEST})
        assert response.status_code in (200, 400), (path, response.status_code, response.text)
        if response.status_code == 200:
            assert response.headers[PATH] == path
        else:
            assert param in response.json()["badRequest"]["message"]
        answers[path] = (response.status_code, response.json())
    assert answers["index"] == answers["fanout"]
    # Every value is checked, as Nova's schema checks each; then the last one counts.
    accepted = all(nova_reads(v) is not None for v in values)
    event("accepted" if accepted else "refused")
    assert (answers["index"][0] == 200) == accepted, values
