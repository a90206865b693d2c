"""Filters as Nova's ``_get_servers`` reads them, found from outside against Nova's
source, on both paths.

``ip`` and ``ip6`` together list the servers either matches, as Nova's ``_ip_filter``
(an IPv4 address matching ``ip`` or an IPv6 one matching ``ip6``) and its Neutron
variant (the instances of both lookups) do; they were ANDed, so ``openstack server
list --ip X --ip6 Y`` got the few servers that matched both. A ``deleted`` value that
is no boolean lists the servers that are not deleted (``bool_from_string(default=
False)``), where it was a 400."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support.api_world import ADMIN
from tests.support.query2_world import Pair


def _get(client: Any, **params: str) -> set[str]:
    query = urlencode({"all_tenants": "1", "limit": "1000", **params})
    return _ids(client.get(f"/v2.1/servers?{query}", headers=ADMIN))


def _ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.text
    servers = response.json()["servers"]
    assert len(servers) < 1000  # one page holds them all
    return {s["id"] for s in servers}


@pytest.mark.parametrize(
    ("ip", "ip6"), [("^10\\.1", ":"), ("\\.1[0-9]$", "::1"), ("^10\\.2", "db8:1:")]
)
def test_ip_and_ip6_together_are_the_union(pair: Pair, ip: str, ip6: str) -> None:
    for client in pair.both():
        v4 = _get(client, ip=ip)
        v6 = _get(client, ip6=ip6)
        assert v4 and v6 and v4 != v6, (len(v4), len(v6))  # else the union proves nothing
        both = _get(client, ip=ip, ip6=ip6)
        assert both == v4 | v6


def test_ip_with_another_filter_is_still_their_intersection(pair: Pair) -> None:
    for client in pair.both():
        v4 = _get(client, ip="^10")
        named = _get(client, name="1")
        both = _get(client, ip="^10", name="1")
        assert both == v4 & named and both != v4


@pytest.mark.parametrize("value", ["perhaps", "", "2", "deleted"])
def test_a_deleted_value_that_is_no_boolean_lists_the_servers_not_deleted(
    pair: Pair, value: str
) -> None:
    for client in pair.both():
        undeleted = _get(client, deleted="false")
        assert _get(client, deleted=value) == undeleted
        assert _get(client, deleted="true") - undeleted  # else the test proves nothing


@pytest.mark.parametrize(
    ("url", "token", "status"),
    [
        ("/v2.1/servers?sort_key=nope", ADMIN, 400),
        ("/v2.1/servers?all_tenants=1", {"X-Auth-Token": "alice:p1"}, 403),
        ("/v2.1/servers/0b3a6c1e-0000-4000-8000-00000000dead", ADMIN, 404),
    ],
)
def test_a_compute_fault_carries_the_microversion_headers(
    pair: Pair, url: str, token: dict[str, str], status: int
) -> None:
    """As Nova's ``Fault`` adds them when the requested version is valid."""
    for client in pair.both():
        response = client.get(url, headers={**token, "OpenStack-API-Version": "compute 2.60"})
        assert response.status_code == status, response.text
        assert response.headers["OpenStack-API-Version"] == "compute 2.60"
        assert response.headers["X-OpenStack-Nova-API-Version"] == "2.60"
        assert "OpenStack-API-Version" in response.headers["Vary"]


def test_a_fault_over_the_version_itself_names_none(pair: Pair) -> None:
    for client in pair.both():
        response = client.get(
            "/v2.1/servers", headers={**ADMIN, "OpenStack-API-Version": "compute 9.9"}
        )
        assert response.status_code == 406, response.text
        assert "OpenStack-API-Version" not in response.headers


def test_an_empty_marker_is_no_marker(pair: Pair) -> None:
    """Nova takes ``marker=`` for none (it was a 400 here)."""
    for client in pair.both():
        assert _get(client, marker="") == _get(client)


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("limit=%205", 400),  # Nova's schema: ^[0-9]*$ for every value
        ("limit=5%20", 400),
        ("limit=5&limit=x", 400),
        ("limit=5%0A", 200),  # Python's $ takes a final newline: Nova lists 5
        ("sort_key=%20display_name", 400),  # compared with the enum before stripping
        ("sort_key=display_name&sort_dir=%20asc", 200),  # directions are stripped
    ],
)
def test_limit_and_sort_values_as_novas_schema_reads_them(
    pair: Pair, query: str, status: int
) -> None:
    for client in pair.both():
        response = client.get(f"/v2.1/servers?all_tenants=1&{query}", headers=ADMIN)
        assert response.status_code == status, response.text
        if status == 200 and "limit" in query:
            assert len(response.json()["servers"]) == 5


@pytest.mark.parametrize("param", ["project_id", "tenant_id", "user_id"])
def test_owner_filters_match_exactly_on_both_paths(pair: Pair, param: str) -> None:
    """Nova compares ``project_id`` and ``user_id`` exactly (its exact-match filters);
    the project was stripped first, so ``project_id=%20p1`` listed p1's servers while
    ``user_id=%20u1`` listed nothing."""
    field = "user_id" if param == "user_id" else "tenant_id"
    for client in pair.both():
        detail = client.get("/v2.1/servers/detail?all_tenants=1&limit=1000", headers=ADMIN)
        owner = detail.json()["servers"][0][field]
        exact = _get(client, **{param: owner})
        assert exact, owner
        for padded in (f" {owner}", f"{owner} ", f"\t{owner}"):
            assert _get(client, **{param: padded}) == set(), padded
