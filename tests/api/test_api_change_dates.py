"""``changes-since`` and ``changes-before`` take what Nova takes, on both paths.

Nova checks every value of these (repeatable) parameters with oslo's
``timeutils.parse_isotime`` (the ``iso8601`` library, UTC when no zone is given) and
uses the last one. So a partial date (``2025``, ``2025-05``, ``2025-5-15``) is the first
instant it names, in UTC; what ``iso8601`` refuses (a lowercase ``z``, a week date,
leading blanks) is a 400; and a bad value among repeated ones is a 400 even when the
last one is good. Cellsight refused partial dates, read more than ``iso8601`` reads
(Python's ``fromisoformat``) and checked only the last value.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from cellsight.api.headers import PATH
from tests.support.api_world import ADMIN, World, both_paths, project_tokens

V266 = {"OpenStack-API-Version": "compute 2.66"}
PATHS = ("index", "fanout")


@pytest.fixture(scope="module")
def clients(
    sqlite_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestClient]]:
    with both_paths(sqlite_world, tmp_path_factory.mktemp("change-dates"), "cd") as clients:
        yield clients


def get(
    client: TestClient,
    path: str,
    params: list[tuple[str, str]],
    headers: dict[str, str] | None = None,
) -> list[str]:
    """The ids listed, in order (every page field checked: 200 from ``path``)."""
    query = urlencode([("limit", "1000"), ("all_tenants", "1"), *params])
    response = client.get(f"/v2.1/servers?{query}", headers={**ADMIN, **(headers or {})})
    assert (response.status_code, response.headers[PATH]) == (200, path), response.text
    return [s["id"] for s in response.json()["servers"]]


def refused(
    client: TestClient, params: list[tuple[str, str]], headers: dict[str, str] | None = None
) -> str:
    """The 400's message."""
    query = urlencode([("all_tenants", "1"), *params])
    response = client.get(f"/v2.1/servers?{query}", headers={**ADMIN, **(headers or {})})
    assert response.status_code == 400, response.text
    return str(response.json()["badRequest"]["message"])


def changed(
    world: World, *, since: datetime | None = None, before: datetime | None = None
) -> set[str]:
    out = set()
    for _, row in world.rows():
        updated = row["updated_at"]
        if updated is None or row.get("forthcoming"):
            continue
        updated = updated if updated.tzinfo else updated.replace(tzinfo=UTC)
        if (since is None or updated >= since) and (before is None or updated <= before):
            out.add(row["uuid"])
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("partial", "full"),
    [
        ("2025", "2025-01-01T00:00:00Z"),
        ("2025-05", "2025-05-01T00:00:00Z"),
        ("2025-5-15", "2025-05-15T00:00:00Z"),
        ("2025-123", "2025-01-23T00:00:00Z"),  # iso8601's reading: month 1, day 23
        ("2025-05-15T06:5", "2025-05-15T06:00:05Z"),  # no minutes: five seconds
        ("2025-04-20 06:30+02:", "2025-04-20T04:30:00Z"),
    ],
)
def test_partial_dates_are_the_first_instant_they_name_in_utc(
    clients: dict[str, TestClient], sqlite_world: World, path: str, partial: str, full: str
) -> None:
    client = clients[path]
    expected = get(client, path, [("changes-since", full)])
    since = datetime.fromisoformat(full.replace("Z", "+00:00"))
    assert set(expected) == changed(sqlite_world, since=since)
    assert 0 < len(expected) < len(sqlite_world.rows())  # the date splits the world
    assert get(client, path, [("changes-since", partial)]) == expected
    before = get(client, path, [("changes-before", partial)], V266)
    assert set(before) == changed(sqlite_world, before=since)


@pytest.mark.parametrize("path", PATHS)
def test_partial_dates_for_members_too(
    clients: dict[str, TestClient], sqlite_world: World, path: str
) -> None:
    token = project_tokens(sqlite_world)[0]
    url = "/v2.1/servers?limit=1000&changes-since="
    partial = clients[path].get(url + "2025-05", headers=token)
    full = clients[path].get(url + "2025-05-01T00:00:00Z", headers=token)
    assert partial.status_code == full.status_code == 200, partial.text
    assert partial.json() == full.json()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "value",
    [
        "2025-06-01t00:00:00z",  # iso8601 wants T and Z
        "2025-06-01X00:00:00",  # any separator: Python's, not iso8601's
        "2025-W23-1",  # week dates
        " 2025-06-01T00:00:00Z",  # no blanks around the value
        "2025-05-15T06,5",  # a fraction of an hour
        "2025-06-01T00:00:00+05:30:15",  # seconds in an offset
    ],
)
def test_what_iso8601_refuses_is_a_400(
    clients: dict[str, TestClient], path: str, value: str
) -> None:
    assert "changes-since" in refused(clients[path], [("changes-since", value)])
    assert "changes-before" in refused(clients[path], [("changes-before", value)], V266)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("param", ["changes-since", "changes-before"])
def test_every_repeated_value_is_checked_and_the_last_one_counts(
    clients: dict[str, TestClient], path: str, param: str
) -> None:
    client = clients[path]
    # A bad value anywhere is a 400 naming the parameter (Nova's schema checks each).
    for values in (["yesterday", "2025-05-01T00:00:00Z"], ["2025-05", "2025-13"]):
        assert param in refused(client, [(param, v) for v in values], V266)
    # Of good ones, the last counts (Nova's ``search_opts.update(req.GET)``).
    first, last = "2024-10", "2025-05"
    both = get(client, path, [(param, first), (param, last)], V266)
    assert both == get(client, path, [(param, last)], V266)
    assert both != get(client, path, [(param, first)], V266)


@pytest.mark.parametrize("path", PATHS)
def test_partial_dates_are_ordered_as_instants(clients: dict[str, TestClient], path: str) -> None:
    # 2025-06 is June 1st 00:00, after any instant of May.
    message = refused(
        clients[path], [("changes-since", "2025-06"), ("changes-before", "2025-05-31T23:59Z")], V266
    )
    assert "changes-since" in message and "less than or equal" in message
    listed = get(
        clients[path], path, [("changes-since", "2025-05"), ("changes-before", "2025-05")], V266
    )
    assert isinstance(listed, list)  # exactly June 1st 00:00 is allowed (since == before)
